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
// the move gave away.
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

TEST_CASE(
    "a shard restarted on files older than the run's map is handed the map "
    "by the first client it refuses, and training goes on",
    "[slots][moves][restart]") {
  const std::string dir = testing::MakeTmpDir("behind-map");
  const auto args = [&](const std::string& files) {
    return std::vector<std::string>{
        absl::StrCat("--num_slots=", kSlots),
        absl::StrCat("--checkpoint_dir=", dir, "/", files)};
  };
  std::vector<ServerProcess> shards;
  for (int i = 0; i < kShards; ++i) {
    absl::StatusOr<ServerProcess> s =
        testing::StartPsServer(i, kShards, args(std::to_string(i)));
    REQUIRE_OK(s.status());
    shards.push_back(*std::move(s));
  }
  std::unique_ptr<PsClient> c = testing::ClusterClient(shards);
  REQUIRE_OK(c->WaitForShards(absl::Seconds(30)));
  REQUIRE_OK(c->Register().status());
  REQUIRE_OK(c->CreateTensors({testing::ConstantSpec(
      "w", {20, 10}, 0.0f, testing::SgdSpec(1.0f), 16)}));
  REQUIRE_OK(c->CreateTables({testing::ConstantTableSpec("emb", kDim, 0.0f)}));
  Step(c.get(), 1);
  // Every shard's files hold map epoch 1 and step 1; a copy of the
  // source's is kept.
  CheckpointAll(shards);
  std::filesystem::copy(dir + "/0", dir + "/0-copy",
                        std::filesystem::copy_options::recursive);

  // Half of shard 0's slots move to shard 1 (map epoch 2); shard 2 is
  // handed the map as psctl move hands it to the shards that took no part.
  const ShardMap even = *ShardMap::EvenSlots(kShards, kSlots);
  std::vector<uint16_t> owners(even.owners().begin(), even.owners().end());
  int moved = 0;
  for (int s = 0; s < kSlots; ++s) {
    if (owners[s] == 0 && moved++ % 2 == 0) owners[s] = 1;
  }
  const ShardMap next = *ShardMap::Slotted(kShards, owners, 2);
  {
    MoveSlotsResponse r;
    const grpc::Status st = testing::MoveSlots(
        shards[1].address, shards[0].address, 0, next, &r, shards[0].address);
    INFO(st.error_message());
    REQUIRE(st.ok());
  }
  {
    auto stub = SlotMoves::NewStub(MakeChannel(shards[2].address));
    AdoptMapRequest request;
    ShardMapToProto(next, request.mutable_map());
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    AdoptMapResponse r;
    REQUIRE(stub->AdoptMap(&ctx, request, &r).ok());
  }
  for (const ServerProcess& s : shards) REQUIRE(MapEpochOf(s) == 2);

  // The shard that took no part dies and comes back on its files, the
  // source on the copy: both serve map epoch 1 again, the source with the
  // slots it gave away.
  Restart(&shards, 2, args("2"));
  Restart(&shards, 0, args("0-copy"));
  CHECK(MapEpochOf(shards[0]) == 1);
  CHECK(MapEpochOf(shards[2]) == 1);

  // The client's steps reach them with map epoch 2 (learnt from shard 1's
  // refusal of epoch 1): refused, the map handed over, applied.
  for (int step = 2; step <= 4; ++step) Step(c.get(), step);
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

}  // namespace
}  // namespace asyncps
