// Live slot moves on real ps_server shards (separate processes on port 0)
// while a worker trains: psctl move and psctl rebalance --apply take slots
// from shard to shard, one map epoch each, and the worker goes on without
// an error. SGD with learning rate 1 and gradients of -1 make the values an
// exact ledger: every element of the dense tensor and of every row equals
// the number of pushes acknowledged, so an update lost or applied twice by
// a move shows. Bad moves are refused and change nothing.
#include <signal.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/ps_client.h"
#include "common/shard_map.h"
#include "common/shard_map_proto.h"
#include "proto/asyncps.pb.h"
#include "tests/integration/ledger_trainer.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

using testing::RunfilePath;
using testing::ServerList;
using testing::ServerProcess;
using testing::StartPsCluster;
using testing::Subprocess;

using testing::ConnectClient;
using testing::LedgerTrainer;
using testing::LedgerWrong;
using testing::Psctl;

constexpr int kShards = 3;
constexpr int kSlots = 64;

TEST_CASE(
    "slots move between live shards while a worker trains: no error, every "
    "acknowledged push applied exactly once",
    "[slots][live-move][ledger]") {
  auto cluster =
      StartPsCluster(kShards, {absl::StrCat("--num_slots=", kSlots)});
  REQUIRE_OK(cluster.status());
  const std::string servers = "--servers=" + ServerList(*cluster);
  std::unique_ptr<PsClient> c = ConnectClient(*cluster);
  LedgerTrainer t;
  t.Start(c.get());

  // Slots 0-15 to shard 1 (from shards 0 and 2: two moves), then 0-7 to
  // shard 2, then an even-out by rows pushed.
  const auto [c1, out1] =
      Psctl({"move", servers, "--slot_list=0-15", "--to_shard=1"});
  INFO(out1);
  CHECK(c1 == 0);
  CHECK(absl::StrContains(out1, "shard 0 -> 1"));
  CHECK(absl::StrContains(out1, "shard 2 -> 1"));
  const int64_t after_first = t.acked.load();
  const auto [c2, out2] =
      Psctl({"move", servers, "--slot_list=0-7", "--to_shard=2", "-o", "json"});
  INFO(out2);
  CHECK(c2 == 0);
  CHECK(absl::StrContains(out2, "\"complete\":true"));
  const auto [c3, out3] = Psctl(
      {"rebalance", servers, "--apply", "--by=updates", "--threshold=1.0"});
  INFO(out3);
  CHECK(c3 == 0);
  // Every slot of shard 1 to shard 0: the shards that own slots are 0 and
  // 2, so a call's parts are no longer at the positions of their shards.
  {
    absl::StatusOr<std::vector<StatusResponse>> now = c->Status();
    REQUIRE_OK(now.status());
    const ShardMap map = *ShardMapOr((*now)[0].map(), kShards);
    std::vector<std::string> slots;
    for (size_t s = 0; s < map.owners().size(); ++s) {
      if (map.owners()[s] == 1) slots.push_back(absl::StrCat(s));
    }
    REQUIRE(!slots.empty());
    const auto [c4, out4] =
        Psctl({"move", servers, "--slot_list=" + absl::StrJoin(slots, ","),
               "--to_shard=0"});
    INFO(out4);
    CHECK(c4 == 0);
  }
  // Training went on through the moves.
  t.WaitForPushes(after_first, 20);
  t.WaitForPushes(t.acked.load(), 20);
  t.Stop();
  REQUIRE_OK(t.error);
  CHECK(t.stale == 0);
  const int64_t n = t.acked.load();
  CHECK(n > after_first);

  // The shards that own slots serve the last map.
  absl::StatusOr<std::vector<StatusResponse>> st = c->Status();
  REQUIRE_OK(st.status());
  const ShardMap last = *ShardMapOr((*st)[0].map(), kShards);
  CHECK(last.epoch() >= 5);
  CHECK(last.serving_shards() == std::vector<int>{0, 2});
  // (Shard 1 owns no slot: the client asks it nothing.)
  for (const int s : last.serving_shards()) {
    CHECK((*st)[s].map().epoch() == last.epoch());
  }

  // The ledger, read by a client that starts now (it adopts the new map).
  c.reset();
  std::unique_ptr<PsClient> reader = ConnectClient(*cluster);
  REQUIRE_OK(reader->WaitForTensors({"emb", "w"}, absl::Seconds(30)));
  CHECK(reader->map() == last);
  INFO("acknowledged pushes " << n);
  CHECK(LedgerWrong(reader.get(), t.ids, n) == 0);
}

TEST_CASE(
    "the automatic rebalance moves hot slots off the busiest shard while a "
    "worker trains, every push applied exactly once",
    "[slots][live-move][rebalance][ledger]") {
  auto cluster =
      StartPsCluster(kShards, {absl::StrCat("--num_slots=", kSlots)});
  REQUIRE_OK(cluster.status());
  std::unique_ptr<PsClient> c = ConnectClient(*cluster);
  // Every row the worker pushes is homed on shard 0: it carries all the
  // rows' load.
  const ShardMap even = c->map();
  const ShardMap::TableKey key = ShardMap::KeyOf("emb");
  LedgerTrainer t;
  t.ids.clear();
  for (uint64_t id = 1; t.ids.size() < 200; ++id) {
    if (even.RowHome(key, id) == 0) t.ids.push_back(id);
  }
  t.Start(c.get());
  auto watch = Subprocess::Start(
      RunfilePath("tools/psctl"),
      {"rebalance", "--servers=" + ServerList(*cluster), "--apply",
       "--watch=1s", "--by=rows", "--threshold=1.1"});
  REQUIRE_OK(watch.status());
  // Until shard 0 gave slots away (or 30 s).
  absl::Status moved = testing::WaitFor(
      [&] {
        absl::StatusOr<std::vector<StatusResponse>> st = c->Status();
        return st.ok() && (*st)[0].map().epoch() > 1;
      },
      absl::Seconds(30), "an automatic move", absl::Milliseconds(100));
  absl::SleepFor(absl::Seconds(1));
  REQUIRE_OK((*watch)->Signal(SIGINT));
  absl::StatusOr<int> code = (*watch)->Wait(absl::Seconds(60));
  t.Stop();
  INFO((*watch)->ReadLog());
  REQUIRE_OK(moved);
  REQUIRE_OK(code.status());
  CHECK(*code == 0);
  REQUIRE_OK(t.error);
  CHECK(t.stale == 0);
  CHECK(absl::StrContains((*watch)->ReadLog(), "shard 0 -> "));

  // Shard 0 owns fewer slots; the ledger holds.
  const ShardMap now = c->map();
  int owned = 0;
  for (const uint16_t o : now.owners()) owned += o == 0;
  CHECK(owned < kSlots / kShards + 1);
  c.reset();
  std::unique_ptr<PsClient> reader = ConnectClient(*cluster);
  REQUIRE_OK(reader->WaitForTensors({"emb", "w"}, absl::Seconds(30)));
  CHECK(LedgerWrong(reader.get(), t.ids, t.acked.load()) == 0);
}

TEST_CASE("bad moves are refused and change nothing",
          "[slots][live-move][bad-input]") {
  auto cluster = StartPsCluster(2, {"--num_slots=16"});
  REQUIRE_OK(cluster.status());
  const std::string servers = "--servers=" + ServerList(*cluster);
  for (const std::vector<std::string>& bad :
       std::vector<std::vector<std::string>>{
           {"--slot_list=16", "--to_shard=0"},
           {"--slot_list=3", "--to_shard=2"},
           {"--slot_list=x", "--to_shard=0"},
           {"--slot_list=5-2", "--to_shard=0"},
           {"--to_shard=0"}}) {
    std::vector<std::string> args = {"move", servers};
    args.insert(args.end(), bad.begin(), bad.end());
    const auto [code, out] = Psctl(args);
    INFO(out);
    CHECK(code == 2);
  }
  // A slot already on its shard moves nothing.
  const auto [code, out] =
      Psctl({"move", servers, "--slot_list=0", "--to_shard=0"});
  INFO(out);
  CHECK(code == 0);
  CHECK(absl::StrContains(out, "nothing to move"));
  // A static run has no slots to move.
  auto fixed = StartPsCluster(2);
  REQUIRE_OK(fixed.status());
  const auto [sc, sout] = Psctl({"move", "--servers=" + ServerList(*fixed),
                                 "--slot_list=0", "--to_shard=1"});
  INFO(sout);
  CHECK(sc == 2);
  CHECK(absl::StrContains(sout, "--num_slots"));
  std::unique_ptr<PsClient> c = ConnectClient(*cluster);
  absl::StatusOr<std::vector<StatusResponse>> st = c->Status();
  REQUIRE_OK(st.status());
  for (const StatusResponse& s : *st) CHECK(s.map().epoch() == 1);
}

}  // namespace
}  // namespace asyncps
