// Trains the real model on the real data set with real processes: 2
// ps_server shards and 2 ps_worker processes, two epochs, and checks the
// accuracy the evaluating worker reports (pipelined workers reach 0.79-0.83
// after one epoch, depending on the machine's load, and 0.83-0.85 after two).
// Also that a worker without the pipeline sends each push with the next
// step's pull (StepStream), the --local baseline and the worker's flag
// validation.
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <chrono>
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

const char kData[] = "/usr/share/datasets/fashion-mnist";

// The value printed on the "final test accuracy: X" line, or -1.
double FinalAccuracy(const std::string& log) {
  std::smatch m;
  static const std::regex re("final test accuracy: ([0-9.]+)");
  return std::regex_search(log, m, re) ? std::stod(m[1]) : -1.0;
}

std::unique_ptr<Subprocess> StartWorker(std::vector<std::string> args) {
  args.push_back(absl::StrCat("--data_dir=", kData));
  auto p = Subprocess::Start(RunfilePath("worker/ps_worker"), args);
  REQUIRE(p.ok());
  return *std::move(p);
}

TEST_CASE("2 shards + 2 workers reach >= 0.80 test accuracy in two epochs",
          "[training]") {
  auto servers = StartPsCluster(2);
  REQUIRE(servers.ok());
  const std::string list = ServerList(*servers);
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int w = 0; w < 2; ++w) {
    workers.push_back(StartWorker(
        {absl::StrCat("--servers=", list), absl::StrCat("--worker_id=", w),
         "--num_workers=2", "--epochs=2", "--log_every_steps=200"}));
  }
  for (auto& w : workers) {
    auto rc = w->Wait(absl::Minutes(5));
    INFO(w->LogTail());
    REQUIRE(rc.ok());
    REQUIRE(*rc == 0);
  }
  const std::string log0 = workers[0]->ReadLog();
  INFO(log0);
  const double acc = FinalAccuracy(log0);
  REQUIRE(acc >= 0.80);
  REQUIRE(acc <= 1.0);
  // Only the evaluating worker prints the final line.
  REQUIRE(FinalAccuracy(workers[1]->ReadLog()) == -1.0);
  // Both workers pushed to both shards: 2 x 938 steps in all.
  REQUIRE(log0.find("worker 0 done: steps 0..938") != std::string::npos);
  REQUIRE(workers[1]->ReadLog().find("worker 1 done: steps 0..938") !=
          std::string::npos);
}

TEST_CASE("an unpipelined worker pushes each step with the next step's pull",
          "[training][step]") {
  auto servers = StartPsCluster(1);
  REQUIRE(servers.ok());
  auto worker =
      StartWorker({absl::StrCat("--servers=", ServerList(*servers)),
                   "--worker_id=0", "--num_workers=1", "--epochs=1",
                   "--steps=40", "--pipeline=false", "--log_every_steps=1000"});
  auto rc = worker->Wait(absl::Minutes(2));
  INFO(worker->LogTail());
  REQUIRE(rc.ok());
  REQUIRE(*rc == 0);
  auto stub = ParameterServer::NewStub(MakeChannel((*servers)[0].address));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  StatusResponse status;
  REQUIRE(stub->Status(&ctx, StatusRequest(), &status).ok());
  // 40 pushes; every one but the last carried the next step's pull.
  CHECK(status.counters().pushes() == 40);
  CHECK(status.counters().steps() == 39);
  CHECK(status.counters().updates_applied() ==
        40 * static_cast<uint64_t>(status.slices()));
}

TEST_CASE("--local trains the same model without servers", "[training]") {
  auto w = StartWorker({"--local", "--steps=300", "--log_every_steps=100"});
  auto rc = w->Wait(absl::Minutes(3));
  INFO(w->LogTail());
  REQUIRE(rc.ok());
  REQUIRE(*rc == 0);
  const double acc = FinalAccuracy(w->ReadLog());
  REQUIRE(acc >= 0.75);
}

TEST_CASE("bad worker flags exit 2 naming the flag", "[training][flags]") {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--servers=127.0.0.1:1", "--worker_id=2", "--num_workers=2"},
       "--worker_id"},
      {{"--servers=nonsense"}, "--servers"},
      {{"--local", "--optimizer=rmsprop"}, "--optimizer"},
      {{"--local", "--lr=-1"}, "--lr"},
      {{"--local", "--hidden=12,x"}, "--hidden"},
      {{"--local", "--device=tpu"}, "--device"},
      {{"--local", "--batch_size=0"}, "--batch_size"},
      {{"--local", "--servers=127.0.0.1:1"}, "--local"},
      {{"--local", "--delay_spike_prob=1.5"}, "--delay_spike_prob"},
      {{"--local", "--delay_spike_ms=-1"}, "--delay_spike_ms"},
  };
  for (const auto& [args, flag] : cases) {
    auto w = StartWorker(args);
    auto rc = w->Wait(absl::Seconds(60));
    INFO(flag << ": " << w->LogTail());
    REQUIRE(rc.ok());
    REQUIRE(*rc == 2);
    REQUIRE(w->ReadLog().find(flag) != std::string::npos);
  }
}

TEST_CASE("a missing data set is a clear error", "[training][bad_input]") {
  auto p = Subprocess::Start(RunfilePath("worker/ps_worker"),
                             {"--local", "--data_dir=/nonexistent"});
  REQUIRE(p.ok());
  auto rc = (*p)->Wait(absl::Seconds(60));
  REQUIRE(rc.ok());
  REQUIRE(*rc == 2);
  REQUIRE((*p)->ReadLog().find("/nonexistent") != std::string::npos);
}

}  // namespace
}  // namespace asyncps
