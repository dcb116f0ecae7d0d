// Shards behind the run's map, in a run without etcd: a shard restarted on
// files older than the map, on its port (killed with SIGKILL after a live
// move it took no part in, whose map it held only in memory; or the
// move's source, restarted on a copy of its files from before the move, as
// when a lost disk is restored from a backup). Real ps_server processes
// with checkpoints. The first push that reaches such a shard
// with the newer map is refused (UNAVAILABLE, saying which epoch the shard
// serves); the client hands the shard its map (AdoptMap, as psctl adopt
// does) and the push's retry is applied: training goes on without anyone
// running psctl adopt, every value exact, and the source drops the slots
// the move gave away. A shard whose files predate a move *into* it is
// refused such a map (its slots' state is gone) until an operator runs
// psctl adopt --remake_lost, which makes those slices anew and says so.
#include <signal.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/ps_client.h"
#include "common/net.h"
#include "common/shard_map.h"
#include "common/shard_map_proto.h"
#include "proto/asyncps.grpc.pb.h"
#include "proto/slot_moves.grpc.pb.h"
#include "tests/testing/cluster_client.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/slot_moves.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/tensor_specs.h"

namespace asyncps {
namespace {

using testing::ServerProcess;

constexpr int kShards = 3;
constexpr int kSlots = 64;
constexpr int kDim = 4;
constexpr int kElems = 200;  // "w": 13 slices of 16

std::vector<uint64_t> Ids() {
  std::vector<uint64_t> ids;
  for (uint64_t i = 0; i < 60; ++i) ids.push_back(7919 * i + 3);
  return ids;
}

// One step of gradients 1 (SGD at learning rate 1: every value is minus the
// steps applied).
void Step(PsClient* c, int step) {
  const std::vector<uint64_t> ids = Ids();
  std::vector<float> w(kElems), rows(ids.size() * kDim);
  auto pull = c->StartPull(
      step, step, PullSet{{{"w", w.data()}}, {{"emb", ids, rows.data()}}});
  REQUIRE_OK(pull->Wait());
  for (float v : w) REQUIRE(v == -static_cast<float>(step - 1));
  const std::vector<float> gw(kElems, 1.0f), gr(ids.size() * kDim, 1.0f);
  auto push =
      c->StartPush(step, PushSet{{{"w", gw.data()}}, {{"emb", ids, gr.data()}}},
                   pull->read());
  absl::StatusOr<PushSummary> summary = push->Wait();
  REQUIRE_OK(summary.status());
  CHECK(summary->duplicates == 0);
  CHECK(summary->refused_stale == 0);
}

StatusResponse ShardStatusOf(const ServerProcess& shard) {
  auto stub = ParameterServer::NewStub(MakeChannel(shard.address));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  StatusResponse st;
  const grpc::Status s = stub->Status(&ctx, StatusRequest(), &st);
  INFO(s.error_message());
  REQUIRE(s.ok());
  return st;
}

uint64_t MapEpochOf(const ServerProcess& shard) {
  return ShardMapOr(ShardStatusOf(shard).map(), kShards)->epoch();
}

void CheckpointAll(const std::vector<ServerProcess>& shards) {
  for (const ServerProcess& s : shards) {
    auto stub = ParameterServer::NewStub(MakeChannel(s.address));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    CheckpointResponse unused;
    const grpc::Status st =
        stub->Checkpoint(&ctx, CheckpointRequest(), &unused);
    INFO(st.error_message());
    REQUIRE(st.ok());
  }
}

void Restart(std::vector<ServerProcess>* shards, int i,
             const std::vector<std::string>& args) {
  ServerProcess& victim = (*shards)[i];
  const int port =
      std::stoi(victim.address.substr(victim.address.rfind(':') + 1));
  REQUIRE_OK(victim.process->Signal(SIGKILL));
  REQUIRE_OK(victim.process->Wait(absl::Seconds(20)).status());
  absl::StatusOr<ServerProcess> again =
      testing::StartPsServer(i, kShards, args, absl::Seconds(60), port);
  REQUIRE_OK(again.status());
  victim = *std::move(again);
}

// 3 shards with checkpoints (each in dir/<index>), "w" and "emb" created
// and one step applied, every shard's files at map epoch 1 and a copy of
// each one's files (dir/<index>-copy); then half of shard 0's slots moved
// to shard 1 (map epoch 2, `next`), which shard 2 is handed as psctl move
// hands it to the shards that took no part.
struct MovedRun {
  std::string dir;
  std::vector<ServerProcess> shards;
  std::unique_ptr<PsClient> client;
  ShardMap next = *ShardMap::EvenSlots(kShards, kSlots);

  std::vector<std::string> Args(const std::string& files) const {
    return {absl::StrCat("--num_slots=", kSlots),
            absl::StrCat("--checkpoint_dir=", dir, "/", files)};
  }
};

MovedRun StartMovedRun() {
  MovedRun run;
  run.dir = testing::MakeTmpDir("behind-map");
  for (int i = 0; i < kShards; ++i) {
    absl::StatusOr<ServerProcess> s =
        testing::StartPsServer(i, kShards, run.Args(std::to_string(i)));
    REQUIRE_OK(s.status());
    run.shards.push_back(*std::move(s));
  }
  run.client = testing::ClusterClient(run.shards);
  PsClient* c = run.client.get();
  REQUIRE_OK(c->WaitForShards(absl::Seconds(30)));
  REQUIRE_OK(c->Register().status());
  REQUIRE_OK(c->CreateTensors({testing::ConstantSpec(
      "w", {20, 10}, 0.0f, testing::SgdSpec(1.0f), 16)}));
  REQUIRE_OK(c->CreateTables({testing::ConstantTableSpec("emb", kDim, 0.0f)}));
  Step(c, 1);
  CheckpointAll(run.shards);
  for (int i = 0; i < kShards; ++i) {
    std::filesystem::copy(absl::StrCat(run.dir, "/", i),
                          absl::StrCat(run.dir, "/", i, "-copy"),
                          std::filesystem::copy_options::recursive);
  }
  std::vector<uint16_t> owners(run.next.owners().begin(),
                               run.next.owners().end());
  int moved = 0;
  for (int s = 0; s < kSlots; ++s) {
    if (owners[s] == 0 && moved++ % 2 == 0) owners[s] = 1;
  }
  run.next = *ShardMap::Slotted(kShards, owners, 2);
  {
    MoveSlotsResponse r;
    const grpc::Status st =
        testing::MoveSlots(run.shards[1].address, run.shards[0].address, 0,
                           run.next, &r, run.shards[0].address);
    INFO(st.error_message());
    REQUIRE(st.ok());
  }
  {
    auto stub = SlotMoves::NewStub(MakeChannel(run.shards[2].address));
    AdoptMapRequest request;
    ShardMapToProto(run.next, request.mutable_map());
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    AdoptMapResponse r;
    REQUIRE(stub->AdoptMap(&ctx, request, &r).ok());
  }
  for (const ServerProcess& s : run.shards) REQUIRE(MapEpochOf(s) == 2);
  return run;
}

TEST_CASE(
    "a shard restarted on files older than the run's map is handed the map "
    "by the first client it refuses, and training goes on",
    "[slots][moves][restart]") {
  MovedRun run = StartMovedRun();
  std::vector<ServerProcess>& shards = run.shards;
  PsClient* c = run.client.get();
  const ShardMap& next = run.next;
  // The shard that took no part dies and comes back on its files, the
  // source on the copy of its files: both serve map epoch 1 again, the
  // source with the slots it gave away.
  Restart(&shards, 2, run.Args("2"));
  Restart(&shards, 0, run.Args("0-copy"));
  CHECK(MapEpochOf(shards[0]) == 1);
  CHECK(MapEpochOf(shards[2]) == 1);

  // The client's steps reach them with map epoch 2 (learnt from shard 1's
  // refusal of epoch 1): refused, the map handed over, applied.
  for (int step = 2; step <= 4; ++step) Step(c, step);
  CHECK(c->map() == next);
  for (int i = 0; i < kShards; ++i) {
    const StatusResponse st = ShardStatusOf(shards[i]);
    INFO("shard " << i << ": " << shards[i].process->LogTail());
    CHECK(ShardMapOr(st.map(), kShards)->epoch() == 2);
    CHECK(*ShardMapOr(st.map(), kShards) == next);
  }
  const std::string source_log = shards[0].process->ReadLog();
  CHECK(absl::StrContains(source_log, "(was epoch 1)"));
  CHECK(absl::StrContains(source_log, "dropping them"));
  CHECK(absl::StrContains(shards[2].process->ReadLog(), "(was epoch 1)"));

  // Every value is the 4 steps, once each.
  const std::vector<uint64_t> ids = Ids();
  std::vector<float> w(kElems), rows(ids.size() * kDim);
  auto read = c->StartPull(
      5, 5,
      PullSet{{{"w", w.data()}}, {{"emb", ids, rows.data(), /*peek=*/true}}});
  REQUIRE_OK(read->Wait());
  int wrong = 0;
  for (float v : w) wrong += v != -4.0f;
  for (float v : rows) wrong += v != -4.0f;
  CHECK(wrong == 0);
}

TEST_CASE(
    "a shard back on files from before a move into it takes the moved slots "
    "only from psctl adopt --remake_lost, made anew",
    "[slots][moves][restart]") {
  MovedRun run = StartMovedRun();
  std::vector<ServerProcess>& shards = run.shards;
  // The destination comes back on the copy of its files from before the
  // move: the run's map gives it slots whose state is gone.
  Restart(&shards, 1, run.Args("1-copy"));
  REQUIRE(MapEpochOf(shards[1]) == 1);
  const std::string servers = "--servers=" + testing::ServerList(shards);
  const auto psctl = [&](std::vector<std::string> args) {
    args.push_back(servers);
    absl::StatusOr<testing::ToolRun> r =
        testing::RunTool("tools/psctl", args, absl::Seconds(60));
    REQUIRE_OK(r.status());
    return *std::move(r);
  };
  // Handed the map as a client hands it (psctl adopt): refused, unchanged.
  const testing::ToolRun plain = psctl({"adopt"});
  INFO(plain.output);
  CHECK(plain.exit_code == 1);
  CHECK(absl::StrContains(plain.output, "psctl adopt --remake_lost"));
  CHECK(MapEpochOf(shards[1]) == 1);
  CHECK(psctl({"status", "--remake_lost"}).exit_code == 2);

  const testing::ToolRun remade = psctl({"adopt", "--remake_lost"});
  INFO(remade.output);
  REQUIRE(remade.exit_code == 0);
  CHECK(absl::StrContains(remade.output, "shard 1 ("));
  CHECK(
      absl::StrContains(remade.output, "slices anew (their updates are lost)"));
  const StatusResponse st = ShardStatusOf(shards[1]);
  CHECK(*ShardMapOr(st.map(), kShards) == run.next);
  CHECK(st.slices_remade() > 0);
  const testing::ToolRun status = psctl({"status"});
  INFO(status.output);
  CHECK(status.exit_code == 1);
  CHECK(absl::StrContains(status.output, "slices anew"));

  // Training goes on: the moved slots from their initial values (0), the
  // others from step 1's (-1).
  PsClient* c = run.client.get();
  std::vector<float> w(kElems);
  auto pull = c->StartPull(2, 2, PullSet{{{"w", w.data()}}, {}});
  REQUIRE_OK(pull->Wait());
  int made_anew = 0, wrong = 0;
  for (float v : w) {
    made_anew += v == 0.0f;
    wrong += v != 0.0f && v != -1.0f;
  }
  CHECK(made_anew > 0);
  CHECK(made_anew < kElems);
  CHECK(wrong == 0);
  const std::vector<float> g(kElems, 1.0f);
  REQUIRE_OK(c->StartPush(2, PushSet{{{"w", g.data()}}, {}}, pull->read())
                 ->Wait()
                 .status());
}

}  // namespace
}  // namespace asyncps
