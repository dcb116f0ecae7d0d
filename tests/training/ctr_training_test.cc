// The CTR model end to end with real processes: 2 ps_server shards and 2
// ps_worker --model=ctr workers on a small synthetic click log; the AUC the
// evaluating worker reports, and the rows the shards hold. Also the --local
// baseline and the CTR flags' validation.
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/net.h"
#include "proto/asyncps.grpc.pb.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

using testing::RunfilePath;
using testing::ServerList;
using testing::StartPsCluster;
using testing::Subprocess;

// The numbers of "final test auc: X (bayes-optimal Y)", or {-1, -1}.
std::pair<double, double> FinalAuc(const std::string& log) {
  std::smatch m;
  static const std::regex re(
      R"(final test auc: ([0-9.]+) \(bayes-optimal ([0-9.]+)\))");
  if (!std::regex_search(log, m, re)) return {-1, -1};
  return {std::stod(m[1]), std::stod(m[2])};
}

std::unique_ptr<Subprocess> StartWorker(std::vector<std::string> args) {
  args.insert(args.begin(), "--model=ctr");
  auto p = Subprocess::Start(RunfilePath("worker/ps_worker"), args);
  REQUIRE(p.ok());
  return *std::move(p);
}

TEST_CASE("2 shards + 2 CTR workers reach an AUC far above chance",
          "[training][ctr]") {
  auto servers = StartPsCluster(2);
  REQUIRE(servers.ok());
  const std::string list = ServerList(*servers);
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int w = 0; w < 2; ++w) {
    workers.push_back(
        StartWorker({absl::StrCat("--servers=", list),
                     absl::StrCat("--worker_id=", w), "--num_workers=2",
                     "--ctr_train_examples=300000", "--ctr_test_examples=20000",
                     "--log_every_steps=200", "--device=cpu"}));
  }
  for (auto& w : workers) {
    auto rc = w->Wait(absl::Minutes(5));
    INFO(w->LogTail());
    REQUIRE(rc.ok());
    REQUIRE(*rc == 0);
  }
  const std::string log0 = workers[0]->ReadLog();
  INFO(log0);
  const auto [auc, bayes] = FinalAuc(log0);
  REQUIRE(bayes > 0.8);
  REQUIRE(auc >= 0.78);
  REQUIRE(auc <= bayes + 0.01);
  REQUIRE(FinalAuc(workers[1]->ReadLog()).first == -1.0);
  REQUIRE(log0.find("worker 0 done: steps 0..586") != std::string::npos);

  // Every field's table holds rows on both shards, about evenly.
  uint64_t rows[2] = {0, 0};
  for (int s = 0; s < 2; ++s) {
    auto stub = ParameterServer::NewStub(MakeChannel((*servers)[s].address));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    StatusResponse status;
    REQUIRE(stub->Status(&ctx, StatusRequest(), &status).ok());
    REQUIRE(status.tables_size() == 8);
    for (const TableStatus& t : status.tables()) {
      REQUIRE(t.rows() > 0);
      REQUIRE(t.pushes() > 0);
      rows[s] += t.rows();
    }
  }
  INFO(rows[0] << " and " << rows[1] << " rows");
  REQUIRE(rows[0] + rows[1] > 100000);
  REQUIRE(std::abs(static_cast<double>(rows[0]) - rows[1]) /
              (rows[0] + rows[1]) <
          0.025);
}

TEST_CASE("--model=ctr --local trains without servers", "[training][ctr]") {
  auto w = StartWorker({"--local", "--ctr_train_examples=200000",
                        "--ctr_test_examples=20000", "--device=cpu"});
  auto rc = w->Wait(absl::Minutes(3));
  INFO(w->LogTail());
  REQUIRE(rc.ok());
  REQUIRE(*rc == 0);
  REQUIRE(FinalAuc(w->ReadLog()).first >= 0.75);
}

TEST_CASE("bad CTR flags exit 2 naming the flag", "[training][ctr][flags]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--ctr_vocab=1000,x", "--ctr_vocab"},
      {"--ctr_zipf=0", "--ctr_zipf"},
      {"--table_optimizer=rmsprop", "--table_optimizer"},
      {"--table_lr=0", "--table_lr"},
      {"--embedding_dim=0", "--embedding_dim"},
      {"--ctr_train_examples=0", "--ctr_train_examples"},
  };
  for (const auto& [flag, name] : cases) {
    auto w = StartWorker({"--local", flag});
    auto rc = w->Wait(absl::Seconds(60));
    INFO(flag << ": " << w->LogTail());
    REQUIRE(rc.ok());
    REQUIRE(*rc == 2);
    REQUIRE(w->ReadLog().find(name) != std::string::npos);
  }
  auto w = Subprocess::Start(RunfilePath("worker/ps_worker"),
                             {"--local", "--model=xyz"});
  REQUIRE(w.ok());
  auto rc = (*w)->Wait(absl::Seconds(60));
  REQUIRE(rc.ok());
  REQUIRE(*rc == 2);
  REQUIRE((*w)->ReadLog().find("--model") != std::string::npos);
}

}  // namespace
}  // namespace asyncps
