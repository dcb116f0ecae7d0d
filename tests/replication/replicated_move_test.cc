// Live slot moves between replicated shard groups (ps_server --replicas=2
// --num_slots), real processes and a real etcd: psctl scale moves the
// slots between the groups' primaries while a worker trains the exact
// ledger (tests/integration/ledger_trainer.h); every replica of a group
// holds the same state after a move; a primary killed (SIGKILL) after a
// move or in the middle of one is replaced by its backup, which holds
// every slot the group owns: no acknowledged push lost or applied twice.

#include <signal.h>

#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/ps_client.h"
#include "common/shard_map.h"
#include "tests/integration/ledger_trainer.h"
#include "tests/replication/replica_harness.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/table_helpers.h"

namespace asyncps {
namespace {

using testing::ExpectSameState;
using testing::LedgerTrainer;
using testing::LedgerWrong;
using testing::MapClient;
using testing::ServerProcess;
using testing::StartReplica;
using testing::WaitFor;
using testing::WaitForCounted;
using testing::WaitForRole;

// Two groups of two replicas; the 64 slots start on group 0.
struct Groups {
  testing::EtcdProcess etcd;
  std::string run;
  std::vector<ServerProcess> replicas;  // a0, b0, a1, b1

  int num_shards = 2;  // groups declared

  ServerProcess Start(int shard, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> flags = {"--num_slots=64", "--serving_shards=1"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    return StartReplica(etcd, run, flags, shard, num_shards);
  }
  // psctl COMMAND through etcd, with `more` flags: exit status and output.
  std::pair<int, std::string> Psctl(const std::string& command,
                                    std::vector<std::string> more = {}) {
    more.insert(more.begin(),
                {command, absl::StrCat("--etcd_endpoints=", etcd.endpoint),
                 absl::StrCat("--run_id=", run)});
    return testing::Psctl(more);
  }
  // Two groups of two, each replica with `extra` and `own(i)` (i: a0, b0,
  // a1, b1) flags.
  void StartAll(
      const std::vector<std::string>& extra = {},
      const std::function<std::vector<std::string>(int)>& own = nullptr) {
    for (int shard = 0; shard < 2; ++shard) {
      for (const char* role : {"primary", "backup"}) {
        std::vector<std::string> flags = extra;
        if (own) {
          const std::vector<std::string> more =
              own(static_cast<int>(replicas.size()));
          flags.insert(flags.end(), more.begin(), more.end());
        }
        replicas.push_back(Start(shard, flags));
        WaitForRole(replicas.back().address, role);
      }
      WaitForCounted(replicas[2 * shard].address, 1);
    }
  }
  // psctl scale to `shards` groups through etcd: its exit status, retried
  // a few times while a group has no primary (a failover under way).
  int Scale(int shards, std::string* out) {
    int code = -1;
    for (int i = 0; i < 8 && code != 0; ++i) {
      if (i > 0) absl::SleepFor(absl::Seconds(2));
      auto [c, o] = Psctl("scale", {absl::StrCat("--shards=", shards)});
      code = c;
      *out += o;
    }
    return code;
  }
  // psctl scale to `shards` (it must exit 0) while `t` trains, then 10
  // more pushes.
  void ScaleWhileTraining(LedgerTrainer* t, int shards) {
    std::string out;
    const int code = Scale(shards, &out);
    INFO(out);
    REQUIRE(code == 0);
    t->WaitForPushes(t->acked.load(), 10);
  }
  // A worker trains through `c` while psctl scales to `shards`: the pushes
  // it had acknowledged when stopped (the test fails on its error).
  int64_t ScaleUnderTraining(PsClient* c, int shards) {
    LedgerTrainer t;
    t.Start(c);
    ScaleWhileTraining(&t, shards);
    t.Stop();
    REQUIRE_OK(t.error);
    return t.acked.load();
  }
  // Every value as the `acked` pushes made it, read through the map, whose
  // slots are on the groups `serving`.
  void ExpectLedger(int64_t acked, const std::vector<int>& serving) {
    INFO("acknowledged pushes " << acked);
    std::unique_ptr<PsClient> reader = MapClient(etcd, run, true);
    REQUIRE_OK(reader->WaitForTensors({"emb", "w"}, absl::Seconds(30)));
    CHECK(LedgerWrong(reader.get(), testing::LedgerIds(), acked) == 0);
    CHECK(reader->map().serving_shards() == serving);
  }
  // psctl scale to `shards` started, not waited for.
  std::unique_ptr<testing::Subprocess> StartScale(int shards) {
    absl::StatusOr<std::unique_ptr<testing::Subprocess>> scale =
        testing::Subprocess::Start(
            testing::RunfilePath("tools/psctl"),
            {"scale", absl::StrCat("--etcd_endpoints=", etcd.endpoint),
             absl::StrCat("--run_id=", run),
             absl::StrCat("--shards=", shards)});
    REQUIRE_OK(scale.status());
    return *std::move(scale);
  }
  void Kill(int i) {
    REQUIRE(replicas[i].process->Signal(SIGKILL).ok());
    (void)replicas[i].process->Wait(absl::Seconds(10));
  }
};

// A run with its etcd and no process yet.
Groups NoGroups(const std::string& run) {
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  return Groups{*std::move(etcd), run, {}};
}

Groups StartGroups(const std::string& run,
                   const std::vector<std::string>& extra = {}) {
  Groups g = NoGroups(run);
  g.StartAll(extra);
  return g;
}

TEST_CASE(
    "slots move between replicated groups while a worker trains; the "
    "replicas agree, and a primary killed after a move loses nothing",
    "[replication][slots][ledger]") {
  if (testing::SkipWithoutEtcd()) return;
  Groups g = StartGroups("rmove");
  std::unique_ptr<PsClient> c = MapClient(g.etcd, g.run);
  CHECK(c->map().serving_shards() == std::vector<int>{0});
  int64_t acked = g.ScaleUnderTraining(c.get(), 2);
  CHECK(c->map().serving_shards() == std::vector<int>{0, 1});
  // Each group's backup took the move's steps: the same state as its
  // primary (the destination's imports and commit, the source's fence,
  // its end and the slots it gave away).
  ExpectSameState(g.replicas[0].address, g.replicas[1].address);
  ExpectSameState(g.replicas[2].address, g.replicas[3].address);

  // The destination's primary dies: its backup serves the moved slots.
  g.Kill(2);
  WaitForRole(g.replicas[3].address, "primary");
  {
    LedgerTrainer t;
    t.Start(c.get());
    // And the slots move back, from the promoted backup.
    g.ScaleWhileTraining(&t, 1);
    // The group that owns every slot loses its primary.
    g.Kill(0);
    WaitForRole(g.replicas[1].address, "primary");
    t.WaitForPushes(t.acked.load(), 10);
    t.Stop();
    REQUIRE_OK(t.error);
    CHECK(t.stale == 0);
    acked += t.acked.load();
  }
  g.ExpectLedger(acked, {0});
}

TEST_CASE(
    "both replicas of a drained group killed (SIGKILL) as soon as the scale "
    "down returns, while a worker trains, cost no error and no push",
    "[replication][slots][ledger]") {
  if (testing::SkipWithoutEtcd()) return;
  Groups g = StartGroups("rdrain");
  std::unique_ptr<PsClient> c = MapClient(g.etcd, g.run);
  LedgerTrainer t;
  t.Start(c.get());
  g.ScaleWhileTraining(&t, 2);
  // Parts in flight to group 1 when it dies go to group 0 naming it; group
  // 0's backup takes the same decisions from its log.
  std::string out;
  const int code = g.Scale(1, &out);
  INFO(out);
  REQUIRE(code == 0);
  g.Kill(2);
  g.Kill(3);
  t.WaitForPushes(t.acked.load(), 20);
  t.Stop();
  REQUIRE_OK(t.error);
  ExpectSameState(g.replicas[0].address, g.replicas[1].address);
  g.ExpectLedger(t.acked.load(), {0});
}

TEST_CASE(
    "a run with etcd grows onto a shard process started after its workers, "
    "which find it through the map without a restart; the groups declared "
    "beyond those with a process are skipped, shown as one row",
    "[replication][slots][ledger]") {
  if (testing::SkipWithoutEtcd()) return;
  Groups g = NoGroups("grow");
  g.num_shards = 300;  // room to grow: groups 1-299 have no process
  // One process per group (R = 1); group 1 has none when the worker starts.
  g.replicas.push_back(g.Start(0, {"--replicas=1"}));
  WaitForRole(g.replicas[0].address, "primary");
  std::unique_ptr<PsClient> c = MapClient(g.etcd, g.run);
  LedgerTrainer t;
  t.Start(c.get());
  t.WaitForPushes(0, 10);
  {
    auto [code, out] = g.Psctl("status");
    INFO(out);
    CHECK(code == 0);
    CHECK(absl::StrContains(out, "1/300 shards up (299 with no process)"));
    CHECK(absl::StrContains(out, "\n1-299 "));
    CHECK(absl::StrContains(out, "no process holds this shard group"));
    std::tie(code, out) = g.Psctl("scale", {"--shards=2"});
    INFO(out);
    CHECK(code == 1);
    CHECK(absl::StrContains(out,
                            "shard 1 has no process: start ps_server "
                            "--shard_index=1"));
    std::tie(code, out) =
        g.Psctl("move", {"--slot_list=0-3", "--to_shard=250"});
    INFO(out);
    CHECK(code == 1);
    CHECK(absl::StrContains(out, "shard 250 has no process"));
    // A rebalance has nothing to balance: one shard owns every slot.
    std::tie(code, out) = g.Psctl("rebalance", {"--apply", "--by=updates"});
    INFO(out);
    CHECK(code == 0);
    CHECK(absl::StrContains(out, "0 slots move"));
  }
  g.replicas.push_back(g.Start(1, {"--replicas=1"}));
  WaitForRole(g.replicas[1].address, "primary");
  g.ScaleWhileTraining(&t, 2);
  t.Stop();
  REQUIRE_OK(t.error);
  CHECK(t.stale == 0);
  CHECK(c->map().serving_shards() == std::vector<int>{0, 1});
  // The new process took the worker's pushes after the move.
  absl::StatusOr<StatusResponse> joined =
      testing::ReplicaStatus(g.replicas[1].address);
  REQUIRE_OK(joined.status());
  CHECK(joined->counters().pushes() > 0);
  g.ExpectLedger(t.acked.load(), {0, 1});
}

TEST_CASE(
    "while a replicated destination's commit waits for its backup, the "
    "answers that carry a map show the map from before",
    "[replication][slots]") {
  if (testing::SkipWithoutEtcd()) return;
  // Long leases and replica timeouts: a stopped backup stays counted (the
  // commit waits for it) for as long as the test looks.
  Groups g =
      StartGroups("rhold", {"--lease_ms=10000", "--replica_timeout_ms=10000"});
  const std::string destination = g.replicas[2].address;
  REQUIRE(g.replicas[3].process->Signal(SIGSTOP).ok());
  std::unique_ptr<testing::Subprocess> scale = g.StartScale(2);
  StatusResponse held;
  const absl::Status committing = WaitFor(
      [&] {
        absl::StatusOr<StatusResponse> s = testing::ReplicaStatus(destination);
        if (s.ok()) held = *s;
        return s.ok() && absl::StrContains(s->slot_move(), "committing");
      },
      absl::Seconds(8), "the destination to commit");
  REQUIRE(g.replicas[3].process->Signal(SIGCONT).ok());
  REQUIRE_OK(committing);
  INFO(held.slot_move());
  // The commit is applied on the primary, not yet held by its backup.
  CHECK(held.map().epoch() == 1);
  absl::StatusOr<int> exit = scale->Wait(absl::Seconds(60));
  REQUIRE_OK(exit.status());
  INFO(scale->ReadLog());
  CHECK(*exit == 0);
  absl::StatusOr<StatusResponse> after = testing::ReplicaStatus(destination);
  REQUIRE_OK(after.status());
  CHECK(after->map().epoch() == 2);
  CHECK(after->slot_move().empty());
}

// A tensor of 32 MiB of values under Adam (96 MiB of state), so that a
// move takes long enough to be killed in the middle.
TensorSpec Big() {
  TensorSpec w;
  w.set_name("big");
  w.add_shape(int64_t{8} << 20);
  w.set_slice_elems(1 << 16);
  w.set_init(INIT_CONSTANT);
  w.set_init_value(0.5f);
  *w.mutable_optimizer() = testing::AdamSpec();
  return w;
}

TEST_CASE(
    "a primary killed in the middle of a move between replicated groups: "
    "the move completes or rolls back, its backup goes on, the next scale "
    "completes, nothing is lost",
    "[replication][slots][ledger]") {
  if (testing::SkipWithoutEtcd()) return;
  // The victim: the destination's primary (replica 2) or the source's (0).
  const int victim = GENERATE(2, 0);
  const int delay_ms = GENERATE(150, 250, 400);
  INFO("killing replica " << victim << " " << delay_ms << " ms into the scale");
  Groups g = StartGroups("rkill");
  std::unique_ptr<PsClient> c = MapClient(g.etcd, g.run);
  REQUIRE_OK(c->CreateTensors({Big()}));
  int64_t acked = 0;
  {
    LedgerTrainer t;
    t.Start(c.get());
    std::unique_ptr<testing::Subprocess> scale = g.StartScale(2);
    absl::SleepFor(absl::Milliseconds(delay_ms));
    g.Kill(victim);
    absl::StatusOr<int> exit = scale->Wait(absl::Seconds(120));
    REQUIRE_OK(exit.status());
    const std::string first = scale->ReadLog();
    INFO(first);
    WARN("replica " << victim << " killed " << delay_ms
                    << " ms into the scale; it exited " << *exit << ": "
                    << first);
    WaitForRole(g.replicas[victim + 1].address, "primary");
    // Whether or not that move went through, the next one does.
    g.ScaleWhileTraining(&t, 2);
    t.Stop();
    REQUIRE_OK(t.error);
    CHECK(t.stale == 0);
    acked = t.acked.load();
  }
  g.ExpectLedger(acked, {0, 1});
  // The victim's group takes a new replica: its snapshot holds what the
  // group owns after the moves.
  const int shard = victim / 2;
  ServerProcess spare = g.Start(shard);
  WaitForCounted(g.replicas[victim + 1].address, 1);
  ExpectSameState(g.replicas[victim + 1].address, spare.address);
}

// The map epoch the shard at `address` serves (0 when it does not answer).
uint64_t ServedEpoch(const std::string& address) {
  absl::StatusOr<StatusResponse> s = testing::ReplicaStatus(address);
  return s.ok() ? s->map().epoch() : 0;
}

TEST_CASE(
    "a group that lost every replica comes back under the run's map: its "
    "backup, restarted on a snapshot from before a move into the group, "
    "adopts the map in etcd and makes the moved slots anew",
    "[replication][slots][ledger]") {
  if (testing::SkipWithoutEtcd()) return;
  Groups g = NoGroups("rlost");
  // Each replica keeps its files: b1's hold the snapshot it joined with,
  // taken while group 1 owned no slot (map epoch 1).
  std::vector<std::string> dirs;
  for (int i = 0; i < 4; ++i) {
    dirs.push_back(testing::MakeTmpDir(absl::StrCat("replica", i)));
  }
  const auto dir_flag = [&](int i) {
    return std::vector<std::string>{absl::StrCat("--checkpoint_dir=", dirs[i])};
  };
  g.StartAll({}, dir_flag);
  std::unique_ptr<PsClient> c = MapClient(g.etcd, g.run);
  const int64_t acked = g.ScaleUnderTraining(c.get(), 2);
  const uint64_t epoch = ServedEpoch(g.replicas[0].address);
  REQUIRE(epoch > 1);
  REQUIRE(ServedEpoch(g.replicas[2].address) == epoch);
  // Both replicas of group 1 lost; its backup comes back first, on its
  // files, and claims the group.
  g.Kill(2);
  g.Kill(3);
  ServerProcess back = g.Start(1, dir_flag(3));
  WaitForRole(back.address, "primary", absl::Seconds(30));
  // It serves the run's map (before: the map of its files, epoch 1, and
  // every request routed by the run's map was refused "retry" for ever).
  REQUIRE_OK(WaitFor([&] { return ServedEpoch(back.address) == epoch; },
                     absl::Seconds(20), "the run's map epoch at the claimant",
                     absl::Milliseconds(100)));
  // One map over the run (it exits 1: group 1 is below R replicas).
  const std::string status = g.Psctl("status").second;
  INFO(status);
  CHECK(
      absl::StrContains(status, absl::StrCat("map: 64 slots, epoch ", epoch)));
  // The loss is loud: a warning naming the shard and what it made anew.
  CHECK(absl::StrContains(status, "shard 1 ("));
  CHECK(absl::StrContains(status, "slices anew"));
  // A reader routed by that map reads every slice: group 0's as the ledger
  // made them, group 1's made anew (zeros: "w" starts at 0).
  std::unique_ptr<PsClient> reader = MapClient(g.etcd, g.run, true);
  REQUIRE_OK(reader->WaitForTensors({"w"}, absl::Seconds(30)));
  const ShardMap map = reader->map();
  REQUIRE(map.epoch() == epoch);
  std::vector<float> w(testing::kLedgerElems);
  auto pull = reader->StartPull(1, 1, PullSet{{{"w", w.data()}}, {}});
  REQUIRE_OK(pull->Wait());
  const int slice_elems = testing::kLedgerElems / 64;
  int kept = 0, remade = 0, wrong = 0;
  for (int i = 0; i < testing::kLedgerElems; ++i) {
    const bool on_lost = map.SliceHome("w", i / slice_elems) == 1;
    const float want = on_lost ? 0.0f : static_cast<float>(acked);
    wrong += w[i] != want;
    (on_lost ? remade : kept) += 1;
  }
  CHECK(wrong == 0);
  CHECK(kept > 0);
  CHECK(remade > 0);
}

TEST_CASE(
    "a shard restarted on files from before a move it took no part in "
    "serves the run's map from etcd without psctl adopt",
    "[replication][slots]") {
  if (testing::SkipWithoutEtcd()) return;
  Groups g = NoGroups("rbehind");
  g.num_shards = 3;
  // Three groups of one process each, the slots spread over all three.
  const std::string dir = testing::MakeTmpDir("shard2");
  for (int shard = 0; shard < 3; ++shard) {
    g.replicas.push_back(
        StartReplica(g.etcd, g.run,
                     {"--num_slots=64", "--replicas=1",
                      absl::StrCat("--checkpoint_dir=", shard == 2 ? dir : "")},
                     shard, 3));
    WaitForRole(g.replicas.back().address, "primary");
  }
  std::unique_ptr<PsClient> c = MapClient(g.etcd, g.run);
  REQUIRE_OK(c->CreateTensors({testing::LedgerTensor()}));
  // Slot 0 (shard 0's) moves to shard 1; shard 2 is handed the new map.
  auto [moved, out] = g.Psctl("move", {"--slot_list=0", "--to_shard=1"});
  INFO(out);
  REQUIRE(moved == 0);
  const uint64_t epoch = ServedEpoch(g.replicas[0].address);
  REQUIRE(epoch > 1);
  REQUIRE(ServedEpoch(g.replicas[2].address) == epoch);
  g.Kill(2);
  ServerProcess back = StartReplica(g.etcd, g.run,
                                    {"--num_slots=64", "--replicas=1",
                                     absl::StrCat("--checkpoint_dir=", dir)},
                                    2, 3);
  // Before: it served its files' map (epoch 1), and every request routed
  // by the run's map was refused "retry" until psctl adopt.
  REQUIRE_OK(WaitFor([&] { return ServedEpoch(back.address) == epoch; },
                     absl::Seconds(20), "the run's map epoch at the restart",
                     absl::Milliseconds(100)));
  std::unique_ptr<PsClient> reader = MapClient(g.etcd, g.run, true);
  REQUIRE_OK(reader->WaitForTensors({"w"}, absl::Seconds(30)));
  std::vector<float> w(testing::kLedgerElems, -1.0f);
  auto pull = reader->StartPull(1, 1, PullSet{{{"w", w.data()}}, {}});
  REQUIRE_OK(pull->Wait());
  int zeros = 0;
  for (float v : w) zeros += v == 0.0f;
  CHECK(zeros == testing::kLedgerElems);  // as created ("w" starts at 0)
}

}  // namespace
}  // namespace asyncps
