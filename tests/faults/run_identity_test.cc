// A run's identity and its shard count, with real processes, as a Job or
// an operator would rerun them: a worker whose share an earlier process of
// the run trained exits 3 instead of a zero-step success, and continues
// where the run was when given more epochs; workers and shards of different
// --run_id refuse each other (exit 2); a shard refuses another run's
// checkpoint (exit 2, naming the file) unless told to adopt it, and files of
// another shard count; a second process of a shard on the first one's
// checkpoint directory exits 2 naming it; psctl reshard turns a stopped 2-shard
// cluster's checkpoints into 3 shards' and then 1 shard's, which serve
// bit-identical parameters, and training continues on them.

#include <signal.h>

#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/ps_client.h"
#include "server/checkpoint_dir.h"
#include "tests/faults/harness.h"
#include "tests/testing/require_ok.h"

namespace asyncps {
namespace {

using testing::FinalAccuracy;
using testing::ServerList;
using testing::ServerProcess;
using testing::StartPsCluster;
using testing::StartWorker;
using testing::Subprocess;
using testing::WaitForLog;

constexpr int kWorkers = 2;
// Steps of one epoch of one of 2 workers: 30000 examples in batches of 64.
constexpr int64_t kEpochSteps = (30000 + 63) / 64;
const std::vector<std::string> kTensors = {"fc0/w", "fc0/b", "fc1/w", "fc1/b"};

std::vector<std::string> ShardArgs(const std::string& dir,
                                   const std::string& run) {
  return {absl::StrCat("--checkpoint_dir=", dir),
          absl::StrCat("--run_id=", run)};
}

std::unique_ptr<Subprocess> Worker(const std::string& servers, int id,
                                   const std::string& run, int epochs,
                                   std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {absl::StrCat("--servers=", servers),
                                   absl::StrCat("--worker_id=", id),
                                   absl::StrCat("--num_workers=", kWorkers),
                                   absl::StrCat("--run_id=", run),
                                   absl::StrCat("--epochs=", epochs),
                                   "--hidden=32",
                                   "--log_every_steps=200",
                                   "--seed=3"};
  args.insert(args.end(), extra.begin(), extra.end());
  absl::StatusOr<std::unique_ptr<Subprocess>> p = StartWorker(args);
  REQUIRE_OK(p.status());
  return *std::move(p);
}

// A worker that ran to its exit.
struct Finished {
  int code = -1;
  std::string log;
};

// Runs both workers to their exit.
std::vector<Finished> RunWorkers(const std::string& servers,
                                 const std::string& run, int epochs) {
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int w = 0; w < kWorkers; ++w) {
    workers.push_back(Worker(servers, w, run, epochs));
  }
  std::vector<Finished> out;
  for (auto& w : workers) {
    absl::StatusOr<int> code = w->Wait(absl::Minutes(3));
    INFO(w->LogTail());
    REQUIRE_OK(code.status());
    out.push_back({*code, w->ReadLog()});
  }
  return out;
}

// Both workers exited 0 and worker 0 reached 0.75 (one epoch of a small
// model reaches 0.78-0.80, two 0.82-0.84); each log
// holds `says` and not `never` (either may be empty: no check).
void CheckTrained(const std::vector<Finished>& workers, const std::string& says,
                  const std::string& never = "") {
  for (const Finished& w : workers) {
    INFO(w.log.substr(w.log.size() > 3000 ? w.log.size() - 3000 : 0));
    CHECK(w.code == 0);
    if (!says.empty()) CHECK(absl::StrContains(w.log, says));
    if (!never.empty()) CHECK_FALSE(absl::StrContains(w.log, never));
  }
  CHECK(FinalAccuracy(workers[0].log) >= 0.75);
}

// Stops shards with SIGTERM (each writes its final checkpoint).
void StopShards(std::vector<ServerProcess>& shards) {
  for (ServerProcess& s : shards) {
    REQUIRE_OK(s.process->Signal(SIGTERM));
    absl::StatusOr<int> code = s.process->Wait(absl::Seconds(30));
    INFO(s.process->LogTail());
    REQUIRE_OK(code.status());
    REQUIRE(*code == 0);
  }
}

// A ps_server that must refuse to start: its exit code and log.
std::pair<int, std::string> RefusedShard(int index, int shards,
                                         const std::vector<std::string>& args) {
  std::vector<std::string> all = {"--port=0",
                                  absl::StrCat("--shard_index=", index),
                                  absl::StrCat("--num_shards=", shards)};
  all.insert(all.end(), args.begin(), args.end());
  absl::StatusOr<std::unique_ptr<Subprocess>> p =
      Subprocess::Start(testing::RunfilePath("server/ps_server"), all);
  REQUIRE_OK(p.status());
  absl::StatusOr<int> code = (*p)->Wait(absl::Seconds(30));
  REQUIRE_OK(code.status());
  return {*code, (*p)->ReadLog()};
}

// Every model tensor as the shards serve it (a pull of a reader that trains
// nothing), by name.
std::map<std::string, std::vector<float>> PullModel(
    const std::vector<ServerProcess>& shards, const std::string& run) {
  PsClientOptions o;
  o.servers.clear();
  for (const ServerProcess& s : shards) o.servers.push_back(s.address);
  o.worker_id = 90;
  o.run_id = run;
  absl::StatusOr<std::unique_ptr<PsClient>> c = PsClient::Connect(o);
  REQUIRE_OK(c.status());
  REQUIRE_OK((*c)->WaitForTensors(kTensors, absl::Seconds(30)));
  std::map<std::string, std::vector<float>> out;
  std::vector<std::pair<std::string, float*>> outs;
  for (const std::string& name : kTensors) {
    const TensorSpec* spec = (*c)->FindSpec(name);
    REQUIRE(spec != nullptr);
    int64_t n = 1;
    for (int64_t d : spec->shape()) n *= d;
    out[name].resize(static_cast<size_t>(n));
    outs.emplace_back(name, out[name].data());
  }
  REQUIRE_OK((*c)->Pull(0, outs));
  REQUIRE_OK((*c)->Heartbeat(0, /*leaving=*/true));
  return out;
}

TEST_CASE(
    "a second process of a shard on the same checkpoint directory exits 2 "
    "naming the first; other shards share it; a killed one lets go",
    "[faults][checkpoint_dir]") {
  const std::string dir = testing::UniqueTmpPath("shared");
  const std::vector<std::string> args = ShardArgs(dir, "r1");
  absl::StatusOr<ServerProcess> first = testing::StartPsServer(0, 2, args);
  REQUIRE_OK(first.status());
  std::vector<std::string> twice = args;
  twice.push_back("--checkpoint_lock_wait_s=1");
  {
    const auto [code, log] = RefusedShard(0, 2, twice);
    INFO(log);
    CHECK(code == 2);
    CHECK(absl::StrContains(
        log, absl::StrCat("the files of shard 0 of 2 in ", dir,
                          " are in use by process ", first->process->pid())));
    CHECK(absl::StrContains(log, "needs a --checkpoint_dir of its own"));
    // It waited for the holder first, and said so.
    CHECK(absl::StrContains(
        log, absl::StrCat("waiting up to 1s for process ",
                          first->process->pid(), " to let go of ")));
  }
  // Shard 1's files are its own.
  absl::StatusOr<ServerProcess> other = testing::StartPsServer(1, 2, args);
  REQUIRE_OK(other.status());
  // Killed, the first lets go at once: the shard restarts on its files.
  REQUIRE_OK(first->process->Signal(SIGKILL));
  REQUIRE_OK(first->process->Wait(absl::Seconds(10)).status());
  absl::StatusOr<ServerProcess> again = testing::StartPsServer(0, 2, twice);
  REQUIRE_OK(again.status());
  std::vector<std::string> bad = args;
  bad.push_back("--checkpoint_lock_wait_s=-1");
  const auto [code, log] = RefusedShard(0, 2, bad);
  INFO(log);
  CHECK(code == 2);
  CHECK(absl::StrContains(log, "--checkpoint_lock_wait_s must be >= 0"));
}

TEST_CASE(
    "a rerun of a finished run exits 3; other runs are refused unless "
    "adopted; more epochs continue the run",
    "[faults][run_id]") {
  const std::string dir = testing::UniqueTmpPath("runs");
  absl::StatusOr<std::vector<ServerProcess>> shards =
      StartPsCluster(2, ShardArgs(dir, "r1"));
  REQUIRE_OK(shards.status());
  const std::string list = ServerList(*shards);
  CheckTrained(RunWorkers(list, "r1", 1), "");
  StopShards(*shards);

  // The shards come back from their checkpoints (a Job restarted, a
  // rerun): the run's workers have nothing left to train.
  shards = StartPsCluster(2, ShardArgs(dir, "r1"));
  REQUIRE_OK(shards.status());
  const std::string again = ServerList(*shards);
  {
    std::unique_ptr<Subprocess> w = Worker(again, 0, "r1", 1);
    absl::StatusOr<int> code = w->Wait(absl::Minutes(1));
    INFO(w->LogTail());
    REQUIRE_OK(code.status());
    CHECK(*code == 3);
    CHECK(absl::StrContains(w->ReadLog(), "already trained its share"));
  }
  // A launcher that restarts a whole job says so: then exit 0, said.
  {
    std::unique_ptr<Subprocess> w =
        Worker(again, 1, "r1", 1, {"--already_trained_ok"});
    absl::StatusOr<int> code = w->Wait(absl::Minutes(1));
    INFO(w->LogTail());
    REQUIRE_OK(code.status());
    CHECK(*code == 0);
    CHECK(absl::StrContains(w->ReadLog(), "exit 0: --already_trained_ok"));
  }
  // A worker of another run is refused before it touches anything.
  {
    std::unique_ptr<Subprocess> w = Worker(again, 1, "r2", 1);
    absl::StatusOr<int> code = w->Wait(absl::Minutes(1));
    INFO(w->LogTail());
    REQUIRE_OK(code.status());
    CHECK(*code == 2);
    CHECK(absl::StrContains(w->ReadLog(), "belongs to run 'r1'"));
  }
  // Two epochs instead of one: the run continues at the end of the first.
  CheckTrained(
      RunWorkers(again, "r1", 2),
      absl::StrCat("resuming at step ", kEpochSteps, " of ", 2 * kEpochSteps));
  StopShards(*shards);

  // Another run on these files: refused, naming the file and the runs.
  const auto [code, log] = RefusedShard(0, 2, ShardArgs(dir, "r2"));
  INFO(log);
  CHECK(code == 2);
  CHECK(absl::StrContains(log, "shard-0-of-2.ckpt belongs to run 'r1'"));
  CHECK(absl::StrContains(log, "--adopt_run=r1"));

  // Adopted: run r2 starts from r1's parameters, with none of its workers'
  // progress: its workers train their shares from step 0.
  std::vector<std::string> adopt = ShardArgs(dir, "r2");
  adopt.push_back("--adopt_run=r1");
  shards = StartPsCluster(2, adopt);
  REQUIRE_OK(shards.status());
  CHECK(absl::StrContains((*shards)[0].process->ReadLog(),
                          "adopting checkpoint"));
  // The adopting shards wrote their checkpoints as r2 at once: the
  // directory is r2's without --adopt_run from now on.
  for (int i = 0; i < 2; ++i) {
    REQUIRE_OK(CheckCheckpointDir({dir, i, 2, "r2", "", true}));
  }
  CheckTrained(RunWorkers(ServerList(*shards), "r2", 1), "",
               "resuming at step");
  StopShards(*shards);
}

TEST_CASE(
    "psctl reshard 2 -> 3 -> 1 serves bit-identical parameters and training "
    "continues; a shard refuses files of another shard count",
    "[faults][reshard]") {
  const std::string two = testing::UniqueTmpPath("two");
  absl::StatusOr<std::vector<ServerProcess>> shards =
      StartPsCluster(2, ShardArgs(two, "rs"));
  REQUIRE_OK(shards.status());
  CheckTrained(RunWorkers(ServerList(*shards), "rs", 1), "");
  const std::map<std::string, std::vector<float>> trained =
      PullModel(*shards, "rs");
  StopShards(*shards);

  // The old directory cannot start a cluster of another size.
  {
    const auto [code, log] = RefusedShard(0, 3, ShardArgs(two, "rs"));
    INFO(log);
    CHECK(code == 2);
    CHECK(absl::StrContains(log, "shard-1-of-2.ckpt"));
    CHECK(absl::StrContains(log, "psctl reshard"));
  }

  auto reshard = [](const std::string& from, const std::string& to, int count) {
    absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Start(
        testing::RunfilePath("tools/psctl"),
        {"reshard", absl::StrCat("--from=", from), absl::StrCat("--to=", to),
         absl::StrCat("--shards=", count)});
    REQUIRE_OK(p.status());
    absl::StatusOr<int> code = (*p)->Wait(absl::Minutes(1));
    INFO((*p)->LogTail());
    REQUIRE_OK(code.status());
    REQUIRE(*code == 0);
    CHECK(absl::StrContains((*p)->ReadLog(),
                            absl::StrCat("resharded run 'rs' from")));
  };
  const std::string three = testing::UniqueTmpPath("three");
  reshard(two, three, 3);
  shards = StartPsCluster(3, ShardArgs(three, "rs"));
  REQUIRE_OK(shards.status());
  CHECK(PullModel(*shards, "rs") == trained);

  // Training continues on 3 shards: a second epoch, from where the first
  // ended.
  CheckTrained(RunWorkers(ServerList(*shards), "rs", 2),
               absl::StrCat("resuming at step ", kEpochSteps));
  const std::map<std::string, std::vector<float>> longer =
      PullModel(*shards, "rs");
  CHECK(longer != trained);
  StopShards(*shards);

  const std::string one = testing::UniqueTmpPath("one");
  reshard(three, one, 1);
  shards = StartPsCluster(1, ShardArgs(one, "rs"));
  REQUIRE_OK(shards.status());
  CHECK(PullModel(*shards, "rs") == longer);
  // The run is complete on one shard as it was on three.
  std::unique_ptr<Subprocess> w = Worker(ServerList(*shards), 1, "rs", 2);
  absl::StatusOr<int> code = w->Wait(absl::Minutes(1));
  INFO(w->LogTail());
  REQUIRE_OK(code.status());
  CHECK(*code == 3);
}

}  // namespace
}  // namespace asyncps
