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

using testing::Subprocess;

// The numbers of "final test auc: X (bayes-optimal Y)", or {-1, -1}.
std::pair<double, double> FinalAuc(const std::string& log) {
  std::smatch m;
  static const std::regex re(
      R"(final test auc: ([0-9.]+) \(bayes-optimal ([0-9.]+)\))");
  if (!std::regex_search(log, m, re)) return {-1, -1};
  return {std::stod(m[1]), std::stod(m[2])};
}

// A ps_worker process (`args` after --model=ctr), or null when it cannot
// start.
std::unique_ptr<Subprocess> Worker(const std::vector<std::string>& args) {
  std::vector<std::string> all = {"--model=ctr"};
  all.insert(all.end(), args.begin(), args.end());
  absl::StatusOr<std::unique_ptr<Subprocess>> p =
      Subprocess::Start(testing::RunfilePath("worker/ps_worker"), all);
  return p.ok() ? *std::move(p) : nullptr;
}

// How a worker ended: its exit status (-1000 when it ran past `limit`) and
// its output.
struct Ended {
  int rc = -1000;
  std::string log;
};
Ended Finish(Subprocess* worker, absl::Duration limit) {
  Ended e;
  absl::StatusOr<int> rc = worker->Wait(limit);
  if (rc.ok()) e.rc = *rc;
  e.log = worker->ReadLog();
  return e;
}

// Each shard may hold 20 MiB: the run's tables need about 30 MB, so they
// fit on two shards and not on one.
constexpr char kCap[] = "--max_parameter_bytes=20M";
constexpr uint64_t kCapBytes = 20 << 20;

TEST_CASE(
    "2 shards + 2 CTR workers reach an AUC far above chance, with "
    "tables larger than one shard may hold",
    "[training][ctr]") {
  absl::StatusOr<std::vector<testing::ServerProcess>> servers =
      testing::StartPsCluster(2, {kCap});
  REQUIRE(servers.ok());
  std::unique_ptr<Subprocess> workers[2];
  for (int w = 0; w < 2; ++w) {
    workers[w] =
        Worker({"--servers=" + testing::ServerList(*servers),
                absl::StrCat("--worker_id=", w), "--num_workers=2",
                "--ctr_train_examples=300000", "--ctr_test_examples=20000",
                "--log_every_steps=200", "--device=cpu"});
    REQUIRE(workers[w] != nullptr);
  }
  const Ended first = Finish(workers[0].get(), absl::Minutes(5));
  const Ended second = Finish(workers[1].get(), absl::Minutes(1));
  INFO(first.log << "\n" << second.log);
  REQUIRE(first.rc == 0);
  REQUIRE(second.rc == 0);
  const auto [auc, bayes] = FinalAuc(first.log);
  REQUIRE(bayes > 0.8);
  REQUIRE(auc >= 0.78);
  REQUIRE(auc <= bayes + 0.01);
  // Only the evaluating worker prints it; each trained its 150000 examples.
  REQUIRE(FinalAuc(second.log).first == -1.0);
  REQUIRE(first.log.find("worker 0 done: steps 0..586") != std::string::npos);

  // Every field's table holds rows on both shards, about evenly; together
  // they take more than one shard may hold.
  uint64_t rows[2] = {0, 0};
  uint64_t reserved = 0;
  for (int s = 0; s < 2; ++s) {
    auto stub = ParameterServer::NewStub(MakeChannel((*servers)[s].address));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    StatusResponse status;
    REQUIRE(stub->Status(&ctx, StatusRequest(), &status).ok());
    REQUIRE(status.tables_size() == 8);
    REQUIRE(status.reserved_parameter_bytes() <= kCapBytes);
    reserved += status.reserved_parameter_bytes();
    for (const TableStatus& t : status.tables()) {
      REQUIRE(t.rows() > 0);
      REQUIRE(t.pushes() > 0);
      rows[s] += t.rows();
    }
  }
  INFO(rows[0] << " and " << rows[1] << " rows");
  REQUIRE(rows[0] + rows[1] > 100000);
  REQUIRE(reserved > kCapBytes);
  REQUIRE(std::abs(static_cast<double>(rows[0]) - rows[1]) /
              (rows[0] + rows[1]) <
          0.025);
}

TEST_CASE("the same tables do not fit on one shard: RESOURCE_EXHAUSTED",
          "[training][ctr][memory]") {
  absl::StatusOr<std::vector<testing::ServerProcess>> servers =
      testing::StartPsCluster(1, {kCap});
  REQUIRE(servers.ok());
  std::unique_ptr<Subprocess> w =
      Worker({"--servers=" + testing::ServerList(*servers),
              "--ctr_train_examples=300000", "--ctr_test_examples=1000",
              "--device=cpu"});
  REQUIRE(w != nullptr);
  const Ended e = Finish(w.get(), absl::Minutes(3));
  INFO(e.log);
  REQUIRE(e.rc == 1);
  REQUIRE(e.log.find("RESOURCE_EXHAUSTED") != std::string::npos);
  REQUIRE(e.log.find("--max_parameter_bytes") != std::string::npos);
}

TEST_CASE("--model=ctr --local trains without servers", "[training][ctr]") {
  std::unique_ptr<Subprocess> w =
      Worker({"--local", "--ctr_train_examples=200000",
              "--ctr_test_examples=20000", "--device=cpu"});
  REQUIRE(w != nullptr);
  const Ended e = Finish(w.get(), absl::Minutes(3));
  INFO(e.log);
  REQUIRE(e.rc == 0);
  REQUIRE(FinalAuc(e.log).first >= 0.75);
}

TEST_CASE("bad CTR flags exit 2 naming the flag", "[training][ctr][flags]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--ctr_vocab=1000,x", "--ctr_vocab"},
      {"--ctr_zipf=0", "--ctr_zipf"},
      {"--table_optimizer=rmsprop", "--table_optimizer"},
      {"--table_lr=0", "--table_lr"},
      {"--embedding_dim=0", "--embedding_dim"},
      {"--ctr_train_examples=0", "--ctr_train_examples"},
      // After --model=ctr: the last one counts.
      {"--model=xyz", "--model"},
  };
  for (const auto& [flag, name] : cases) {
    std::unique_ptr<Subprocess> w = Worker({"--local", flag});
    REQUIRE(w != nullptr);
    const Ended e = Finish(w.get(), absl::Seconds(60));
    INFO(flag << ": " << e.log);
    CHECK(e.rc == 2);
    CHECK(e.log.find(name) != std::string::npos);
  }
}

}  // namespace
}  // namespace asyncps
