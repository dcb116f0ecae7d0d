// Shard restarts and network cuts during real training: a shard killed
// with SIGKILL and started again with the same flags (from its checkpoint)
// is found again by every worker, which carry on without help and end
// within 0.02 test accuracy of an undisturbed run; one killed before its
// first checkpoint comes back with the tensors of its spec file (initial
// values) and training goes on; a 5 s network cut
// between the workers and a shard stalls training, which then continues
// with every step applied exactly once.

#include <signal.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/ps_client.h"
#include "tests/faults/harness.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/tcp_proxy.h"

namespace asyncps {
namespace {

using testing::FinalAccuracy;
using testing::ServerProcess;
using testing::StartPsServer;
using testing::StartWorker;
using testing::Subprocess;
using testing::WaitForLog;

constexpr int kShards = 2;
constexpr int kWorkers = 2;

std::vector<std::string> WorkerArgs(const std::string& servers, int id,
                                    int epochs = 3) {
  return {absl::StrCat("--servers=", servers),
          absl::StrCat("--worker_id=", id),
          absl::StrCat("--num_workers=", kWorkers),
          absl::StrCat("--epochs=", epochs),
          "--log_every_steps=100",
          "--seed=7"};
}

std::vector<ServerProcess> StartShards(const std::vector<std::string>& args) {
  std::vector<ServerProcess> shards;
  for (int i = 0; i < kShards; ++i) {
    absl::StatusOr<ServerProcess> s = StartPsServer(i, kShards, args);
    REQUIRE_OK(s.status());
    shards.push_back(*std::move(s));
  }
  return shards;
}

std::string List(const std::vector<std::string>& addresses) {
  return absl::StrCat(addresses[0], ",", addresses[1]);
}

// Runs the workers to the end; returns worker 0's final accuracy.
std::vector<Subprocess*> Raw(
    const std::vector<std::unique_ptr<Subprocess>>& processes) {
  std::vector<Subprocess*> out;
  for (const auto& p : processes) out.push_back(p.get());
  return out;
}

double Finish(std::vector<std::unique_ptr<Subprocess>>& workers) {
  for (auto& w : workers) {
    absl::StatusOr<int> code = w->Wait(absl::Minutes(4));
    INFO(w->LogTail());
    REQUIRE_OK(code.status());
    REQUIRE(*code == 0);
  }
  return FinalAccuracy(workers[0]->ReadLog());
}

std::vector<std::unique_ptr<Subprocess>> StartWorkers(const std::string& list) {
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int w = 0; w < kWorkers; ++w) {
    absl::StatusOr<std::unique_ptr<Subprocess>> p =
        StartWorker(WorkerArgs(list, w));
    REQUIRE_OK(p.status());
    workers.push_back(*std::move(p));
  }
  return workers;
}

TEST_CASE(
    "a shard killed with SIGKILL and restarted from its checkpoint is "
    "survived without help",
    "[faults][shard_restart]") {
  // The undisturbed run of the same length.
  double undisturbed;
  {
    std::vector<ServerProcess> shards = StartShards({});
    std::vector<std::unique_ptr<Subprocess>> workers =
        StartWorkers(List({shards[0].address, shards[1].address}));
    undisturbed = Finish(workers);
  }

  const std::string dir = testing::UniqueTmpPath("ckpt");
  const std::vector<std::string> args = {absl::StrCat("--checkpoint_dir=", dir),
                                         "--checkpoint_every_s=1"};
  std::vector<ServerProcess> shards = StartShards(args);
  const std::string list = List({shards[0].address, shards[1].address});
  std::vector<std::unique_ptr<Subprocess>> workers = StartWorkers(list);
  // Killed while every worker still trains: the first to start epoch 2 of
  // 3 (a worker that finished before the kill would never see the rollback).
  REQUIRE_OK(
      testing::WaitForAnyLog(Raw(workers), "epoch 2/3", absl::Minutes(2)));
  REQUIRE_OK(WaitForLog(shards[1].process.get(), "checkpoint written",
                        absl::Seconds(30)));
  const int port = testing::PortOf(shards[1].address);
  REQUIRE_OK(shards[1].process->Signal(SIGKILL));
  REQUIRE_OK(shards[1].process->Wait(absl::Seconds(10)).status());
  // The workers keep retrying meanwhile; the shard comes back 2 s later on
  // the same port with the same flags.
  absl::SleepFor(absl::Seconds(2));
  absl::StatusOr<ServerProcess> back =
      StartPsServer(1, kShards, args, absl::Seconds(30), port);
  REQUIRE_OK(back.status());
  shards[1] = *std::move(back);

  const double disturbed = Finish(workers);
  INFO("undisturbed " << undisturbed << ", with a shard restart " << disturbed);
  CHECK(disturbed >= undisturbed - 0.02);
  CHECK(disturbed >= 0.8);
  const std::string shard_log = shards[1].process->ReadLog();
  CHECK(absl::StrContains(shard_log, "restored checkpoint"));
  // Every worker noticed the rollback, once.
  for (auto& w : workers) {
    const std::string log = w->ReadLog();
    CHECK(absl::StrContains(log, "restarted (epoch"));
  }
  absl::StatusOr<StatusResponse> st = testing::ShardStatus(shards[1].address);
  REQUIRE_OK(st.status());
  CHECK(st->restored_from().workers() == kWorkers);
  CHECK(st->counters().rejected_bad_input() == 0);
}

TEST_CASE(
    "a shard killed before its first checkpoint comes back with its tensors "
    "and training goes on",
    "[faults][shard_restart]") {
  const std::string dir = testing::UniqueTmpPath("early");
  // No periodic checkpoints: only the spec file is on disk at the kill.
  const std::vector<std::string> args = {absl::StrCat("--checkpoint_dir=", dir),
                                         "--run_id=early-kill"};
  std::vector<ServerProcess> shards = StartShards(args);
  const std::string list = List({shards[0].address, shards[1].address});
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int w = 0; w < kWorkers; ++w) {
    std::vector<std::string> a = WorkerArgs(list, w, /*epochs=*/2);
    a.push_back("--run_id=early-kill");
    absl::StatusOr<std::unique_ptr<Subprocess>> p = StartWorker(a);
    REQUIRE_OK(p.status());
    workers.push_back(*std::move(p));
  }
  REQUIRE_OK(
      testing::WaitForAnyLog(Raw(workers), "step 100/", absl::Minutes(2)));
  const int port = testing::PortOf(shards[1].address);
  REQUIRE_OK(shards[1].process->Signal(SIGKILL));
  REQUIRE_OK(shards[1].process->Wait(absl::Seconds(10)).status());
  absl::StatusOr<ServerProcess> back =
      StartPsServer(1, kShards, args, absl::Seconds(30), port);
  REQUIRE_OK(back.status());
  shards[1] = *std::move(back);

  // Shard 1's half of the model starts over at step 100 of 2 epochs and
  // catches up with the other half: at least 0.8 alone, 0.786 once in a
  // loaded full suite; a shard back without its tensors fails the run, one
  // serving garbage stays near chance (0.1).
  const double acc = Finish(workers);
  CHECK(acc >= 0.75);
  const std::string shard_log = shards[1].process->ReadLog();
  INFO(shard_log);
  CHECK(absl::StrContains(shard_log, "no checkpoint at"));
  CHECK(absl::StrContains(shard_log, "created 6 tensor(s)/table(s) from"));
  for (auto& w : workers) {
    const std::string log = w->ReadLog();
    CHECK(absl::StrContains(log, "restarted (epoch"));
    CHECK_FALSE(absl::StrContains(log, "NOT_FOUND"));
  }
}

TEST_CASE(
    "a 5 s network cut stalls training, which then goes on with every "
    "step applied exactly once",
    "[faults][network]") {
  // The lease only bounds the stall: a worker silent for a minute after a
  // 5 s cut has hung. (With a 20 s lease, both workers were evicted once in
  // about 15 runs of the whole suite on 2 loaded cores; not reproduced in 12
  // runs of this test under load. The shard log is shown if it happens.)
  std::vector<ServerProcess> shards = StartShards({"--worker_lease_ms=60000"});
  // The workers reach shard 1 through a proxy that holds all traffic for
  // 5 s mid-run (connections stay open, nothing moves).
  absl::StatusOr<std::unique_ptr<testing::TcpProxy>> proxy =
      testing::TcpProxy::Start(shards[1].address);
  REQUIRE_OK(proxy.status());
  const std::string list = List({shards[0].address, (*proxy)->address()});
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int w = 0; w < kWorkers; ++w) {
    absl::StatusOr<std::unique_ptr<Subprocess>> p =
        StartWorker(WorkerArgs(list, w, /*epochs=*/2));
    REQUIRE_OK(p.status());
    workers.push_back(*std::move(p));
  }
  REQUIRE_OK(WaitForLog(workers[0].get(), "step 300/", absl::Minutes(2)));
  (*proxy)->Hold();
  absl::SleepFor(absl::Seconds(5));
  (*proxy)->Release();
  // Training went on after the cut: far above chance (0.1). Alone this
  // reaches 0.8 or more; in a loaded full suite 0.778 was seen once, as the
  // restart case above. The exact check is the step count below.
  const double acc = Finish(workers);
  CHECK(acc >= 0.75);

  // Every step of every worker was applied once on each shard: the
  // registry counts steps * workers pushes, and each slice's version is
  // the total (no refusals under ASP, no push applied twice).
  constexpr int64_t kSteps = 2 * 469;
  PsClientOptions o;
  o.servers = {shards[0].address, shards[1].address};
  o.worker_id = 50;
  absl::StatusOr<std::unique_ptr<PsClient>> client = PsClient::Connect(o);
  REQUIRE_OK(client.status());
  REQUIRE_OK((*client)->WaitForTensors({"fc0/w"}, absl::Seconds(10)));
  std::vector<float> w0(784 * 256);
  REQUIRE_OK((*client)->Pull(0, {{"fc0/w", w0.data()}}));
  for (uint64_t v : (*client)->PulledVersions("fc0/w")) {
    CHECK(v == static_cast<uint64_t>(kWorkers * kSteps));
  }
  for (const ServerProcess& s : shards) {
    absl::StatusOr<StatusResponse> st = testing::ShardStatus(s.address);
    REQUIRE_OK(st.status());
    for (int w = 0; w < kWorkers; ++w) {
      const WorkerStatus* ws = testing::FindWorker(*st, w);
      REQUIRE(ws != nullptr);
      CHECK(ws->pushes() == static_cast<uint64_t>(kSteps));
    }
    INFO(s.process->LogTail());
    CHECK(st->counters().evictions() == 0);
  }
}

}  // namespace
}  // namespace asyncps
