// Live map changes on real ps_server shards (separate processes on port 0):
// AdoptMap moves the shards to newer epochs of the same slots while a
// PsClient trains, first on one shard and then on the others, and the
// client goes on without an error (parts refused for the older map are
// routed again, parts sent with a map a shard has not learnt yet are
// retried); every acknowledged push is applied exactly once, checked
// against an exact ledger (SGD at learning rate 1 on constant gradients).
// Raw requests show the shards' rules: an older epoch is refused with the
// shard's map, a newer one is unavailable, a push applied before is
// acknowledged whatever epoch its retry names; AdoptMap refuses maps that
// give the shard slots (only a move does).
#include "tests/testing/slot_moves.h"

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/ps_client.h"
#include "common/map_change.h"
#include "common/net.h"
#include "common/shard_map.h"
#include "common/shard_map_proto.h"
#include "proto/asyncps.grpc.pb.h"
#include "proto/slot_moves.grpc.pb.h"
#include "tests/testing/cluster_client.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/stream_helpers.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/tensor_specs.h"

namespace asyncps {
namespace {

using testing::MoveSlots;
using testing::ServerProcess;

constexpr int kShards = 3;
constexpr int kSlots = 64;
constexpr int kDim = 4;
constexpr int kSteps = 30;
constexpr int kElems = 200;  // "w": 13 slices of 16

ShardMap EvenAt(uint64_t epoch) {
  const ShardMap even = *ShardMap::EvenSlots(kShards, kSlots);
  return *ShardMap::Slotted(
      kShards,
      std::vector<uint16_t>(even.owners().begin(), even.owners().end()), epoch);
}

grpc::Status AdoptMap(const ServerProcess& shard, const ShardMap& map,
                      AdoptMapResponse* response) {
  auto stub = SlotMoves::NewStub(MakeChannel(shard.address));
  AdoptMapRequest request;
  ShardMapToProto(map, request.mutable_map());
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  return stub->AdoptMap(&ctx, request, response);
}

void Adopt(const ServerProcess& shard, const ShardMap& map) {
  AdoptMapResponse r;
  const grpc::Status s = AdoptMap(shard, map, &r);
  INFO(s.error_message());
  REQUIRE(s.ok());
  REQUIRE(r.map().epoch() == map.epoch());
}

// The ids of step `step`: some repeated, some new.
std::vector<uint64_t> IdsOf(int step) {
  std::vector<uint64_t> ids;
  for (uint64_t i = 0; i < 24; ++i) ids.push_back(1 + (i * 7 + step) % 40);
  ids.push_back(1000 + step);
  ids.push_back(3);
  return ids;
}

TEST_CASE(
    "a client trains on through live map changes, some shards ahead of the "
    "others, with every acknowledged push applied once",
    "[slots][moves][exactly-once]") {
  auto cluster =
      testing::StartPsCluster(kShards, {absl::StrCat("--num_slots=", kSlots)});
  REQUIRE_OK(cluster.status());
  std::unique_ptr<PsClient> c = testing::ClusterClient(*cluster);
  REQUIRE_OK(c->WaitForShards(absl::Seconds(30)));
  REQUIRE_OK(c->Register().status());
  REQUIRE_OK(c->CreateTensors({testing::ConstantSpec(
      "w", {20, 10}, 0.0f, testing::SgdSpec(1.0f), 16)}));
  REQUIRE_OK(c->CreateTables({testing::ConstantTableSpec("emb", kDim, 0.0f)}));
  REQUIRE(c->map() == EvenAt(ShardMap::kStaticEpoch));

  // The ledger: pushes acknowledged, and per row the gradients pushed.
  std::atomic<int> acked{0};
  std::atomic<bool> done{false};
  // Steps 6, 13 and 21 start once map change 1, 2, 3 began (so that each
  // meets the shards mid-change).
  std::atomic<int> changes{0};
  std::map<uint64_t, int> ledger;
  absl::Status failed;
  int pulled_wrong = 0;
  std::thread trainer([&] {
    for (int step = 1; step <= kSteps && failed.ok(); ++step) {
      const int change = step == 6 ? 1 : step == 13 ? 2 : step == 21 ? 3 : 0;
      failed = testing::WaitFor([&] { return changes.load() >= change; },
                                absl::Seconds(60), "a map change");
      if (!failed.ok()) break;
      const std::vector<uint64_t> ids = IdsOf(step);
      std::vector<float> w(kElems), rows(ids.size() * kDim);
      auto pull = c->StartPull(
          step, step, PullSet{{{"w", w.data()}}, {{"emb", ids, rows.data()}}});
      failed = pull->Wait();
      if (!failed.ok()) break;
      // What was pulled is the ledger so far.
      for (float v : w) pulled_wrong += v != -static_cast<float>(step - 1);
      for (size_t i = 0; i < ids.size(); ++i) {
        const auto it = ledger.find(ids[i]);
        const float want = it == ledger.end() ? 0.0f : -it->second;
        pulled_wrong += rows[i * kDim] != want;
      }
      const std::vector<float> gw(kElems, 1.0f);
      const std::vector<float> gr(ids.size() * kDim, 1.0f);
      auto push = c->StartPush(
          step, PushSet{{{"w", gw.data()}}, {{"emb", ids, gr.data()}}},
          pull->read());
      absl::StatusOr<PushSummary> summary = push->Wait();
      failed = summary.status();
      if (!failed.ok()) break;
      // Counted as if routed right the first time.
      std::map<uint64_t, int> distinct;
      for (uint64_t id : ids) ++distinct[id];
      if (summary->applied != 13 + static_cast<int64_t>(distinct.size()) ||
          summary->duplicates != 0 || summary->refused_stale != 0) {
        failed = absl::InternalError(absl::StrCat(
            "step ", step, ": applied ", summary->applied, ", duplicates ",
            summary->duplicates, ", refused ", summary->refused_stale));
        break;
      }
      for (uint64_t id : ids) ++ledger[id];
      acked.store(step);
    }
    done.store(true);
  });
  const auto reached = [&](int step) {
    return testing::WaitFor([&] { return acked.load() >= step || done; },
                            absl::Seconds(60), "training steps");
  };

  // Epoch 2 reaches shard 0 first: the client follows it from shard 0's
  // refusal, and its requests to shards 1 and 2 (routed with epoch 2) are
  // refused and retried until they have it too (the client hands it to
  // them, as psctl adopt does, or the test below does first).
  REQUIRE_OK(reached(5));
  Adopt((*cluster)[0], EvenAt(2));
  changes.store(1);
  absl::SleepFor(absl::Milliseconds(400));
  Adopt((*cluster)[1], EvenAt(2));
  Adopt((*cluster)[2], EvenAt(2));
  // Epoch 3, the other way round; then 4 everywhere at once.
  REQUIRE_OK(reached(12));
  Adopt((*cluster)[2], EvenAt(3));
  Adopt((*cluster)[1], EvenAt(3));
  changes.store(2);
  absl::SleepFor(absl::Milliseconds(400));
  Adopt((*cluster)[0], EvenAt(3));
  REQUIRE_OK(reached(20));
  for (const ServerProcess& s : *cluster) Adopt(s, EvenAt(4));
  changes.store(3);
  REQUIRE_OK(testing::WaitFor([&] { return done.load(); }, absl::Seconds(90),
                              "the training loop"));
  trainer.join();
  REQUIRE_OK(failed);
  CHECK(acked.load() == kSteps);
  CHECK(pulled_wrong == 0);
  CHECK(c->map() == EvenAt(4));

  // The values are exactly the ledger.
  std::vector<uint64_t> ids;
  for (const auto& [id, n] : ledger) ids.push_back(id);
  std::vector<float> w(kElems), rows(ids.size() * kDim);
  auto read = c->StartPull(
      kSteps, kSteps,
      PullSet{{{"w", w.data()}}, {{"emb", ids, rows.data(), /*peek=*/true}}});
  REQUIRE_OK(read->Wait());
  for (float v : w) REQUIRE(v == -static_cast<float>(kSteps));
  for (size_t i = 0; i < ids.size(); ++i) {
    INFO("row " << ids[i]);
    for (int d = 0; d < kDim; ++d) {
      REQUIRE(rows[i * kDim + d] == -static_cast<float>(ledger[ids[i]]));
    }
  }
}

PushRequest RawPush(uint64_t seq, uint64_t map_epoch) {
  PushRequest p;
  p.mutable_worker()->set_worker_id(7);
  p.mutable_worker()->set_incarnation(11);
  p.set_seq(seq);
  p.set_map_epoch(map_epoch);
  return p;
}

TEST_CASE(
    "shards refuse older maps with theirs, newer ones as unavailable, and "
    "AdoptMap never gives a shard slots",
    "[slots][moves][map]") {
  auto cluster = testing::StartPsCluster(2, {absl::StrCat("--num_slots=", 16)});
  REQUIRE_OK(cluster.status());
  const ServerProcess& shard = (*cluster)[0];
  const ShardMap even = *ShardMap::EvenSlots(2, 16);
  std::vector<uint16_t> owners(even.owners().begin(), even.owners().end());
  const ShardMap next = *ShardMap::Slotted(2, owners, 5);
  AdoptMapResponse r;
  REQUIRE(AdoptMap(shard, next, &r).ok());
  CHECK(r.map().epoch() == 5);
  CHECK(AdoptMap(shard, next, &r).ok());  // again: nothing changes

  // A slot of shard 1 given to shard 0 (a gain needs a move: its state is
  // on shard 1), an older epoch, another slot count, a malformed map.
  std::vector<uint16_t> gained = owners;
  gained[1] = 0;
  grpc::Status s = AdoptMap(shard, *ShardMap::Slotted(2, gained, 6), &r);
  CHECK(s.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(s.error_message().find("slot 1") != std::string::npos);
  s = AdoptMap(shard, *ShardMap::Slotted(2, owners, 4), &r);
  CHECK(s.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  s = AdoptMap(shard, *ShardMap::EvenSlots(2, 32), &r);
  CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  {
    auto stub = SlotMoves::NewStub(MakeChannel(shard.address));
    AdoptMapRequest bad;
    bad.mutable_map()->set_num_shards(2);
    bad.mutable_map()->set_num_slots(16);
    bad.mutable_map()->set_epoch(9);
    grpc::ClientContext ctx;
    CHECK(stub->AdoptMap(&ctx, bad, &r).error_code() ==
          grpc::StatusCode::INVALID_ARGUMENT);
    // A move without a map is malformed.
    MoveSlotsResponse unused;
    grpc::ClientContext move_ctx;
    CHECK(
        stub->MoveSlots(&move_ctx, MoveSlotsRequest(), &unused).error_code() ==
        grpc::StatusCode::INVALID_ARGUMENT);
  }

  testing::ShardStreams streams(MakeChannel(shard.address));
  // Routed with an older map: refused with the shard's.
  PushResponse old_push = streams.Push(RawPush(1, 4));
  CHECK(old_push.status().code() == grpc::StatusCode::FAILED_PRECONDITION);
  REQUIRE(old_push.status().has_map());
  CHECK(*ShardMapFromProto(old_push.status().map()) == next);
  PullRequest pull;
  pull.mutable_worker()->set_worker_id(7);
  pull.mutable_worker()->set_incarnation(11);
  pull.set_map_epoch(3);
  PullResponse old_pull = streams.Pull(pull);
  CHECK(old_pull.status().code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(old_pull.status().map().epoch() == 5);
  // Routed with a newer map: unavailable (retried), no map.
  PushResponse new_push = streams.Push(RawPush(2, 6));
  CHECK(new_push.status().code() == grpc::StatusCode::UNAVAILABLE);
  CHECK(!new_push.status().has_map());
  pull.set_map_epoch(6);
  CHECK(streams.Pull(pull).status().code() == grpc::StatusCode::UNAVAILABLE);
  // Applied under epoch 5, then the shard moves on: a retry naming epoch 5
  // is acknowledged as a duplicate, a new push naming it is refused.
  PushResponse applied = streams.Push(RawPush(3, 5));
  CHECK(applied.status().code() == 0);
  CHECK(!applied.duplicate());
  REQUIRE(AdoptMap(shard, *ShardMap::Slotted(2, owners, 6), &r).ok());
  PushResponse retried = streams.Push(RawPush(3, 5));
  CHECK(retried.status().code() == 0);
  CHECK(retried.duplicate());
  CHECK(streams.Push(RawPush(4, 5)).status().code() ==
        grpc::StatusCode::FAILED_PRECONDITION);
  // The refused seq was given back: routed again, it is applied.
  PushResponse again = streams.Push(RawPush(4, 6));
  CHECK(again.status().code() == 0);
  CHECK(!again.duplicate());
}

TEST_CASE(
    "a source fences its slots only for a destination that is copying the "
    "move",
    "[slots][moves][bad-input]") {
  auto cluster = testing::StartPsCluster(2, {absl::StrCat("--num_slots=", 16)});
  REQUIRE_OK(cluster.status());
  const ServerProcess& source = (*cluster)[0];
  const ShardMap even = *ShardMap::EvenSlots(2, 16);
  // Slot 0 of shard 0 to shard 1, map epoch 2.
  const ShardMap next = *WithSlotsMoved(even, {0}, 1);
  auto stub = SlotMoves::NewStub(MakeChannel(source.address));
  // A destination that does not answer, and a real one that is not
  // copying: neither makes the source fence.
  for (const std::string& destination :
       {std::string("127.0.0.1:1"), (*cluster)[1].address}) {
    ExportSlotsRequest request;
    ShardMapToProto(next, request.mutable_next_map());
    request.set_destination_index(1);
    request.set_destination(destination);
    request.set_fence(true);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    auto reader = stub->ExportSlots(&ctx, request);
    ExportSlotsChunk chunk;
    int chunks = 0;
    while (reader->Read(&chunk)) ++chunks;
    const grpc::Status s = reader->Finish();
    INFO(destination << ": " << s.error_message());
    CHECK(s.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
    CHECK(s.error_message().find("does not confirm") != std::string::npos);
    CHECK(chunks == 0);
  }
  // Not fenced: a push routed with the shard's map is applied.
  testing::ShardStreams streams(MakeChannel(source.address));
  const PushResponse push = streams.Push(RawPush(1, 1));
  INFO(push.status().message());
  CHECK(push.status().code() == 0);
}

TEST_CASE(
    "a move whose source cannot be reached is aborted before any fence, and "
    "the same map epoch can be moved to again",
    "[slots][moves]") {
  auto cluster = testing::StartPsCluster(2, {absl::StrCat("--num_slots=", 16)});
  REQUIRE_OK(cluster.status());
  const ShardMap even = *ShardMap::EvenSlots(2, 16);
  // Slot 0 of shard 0 to shard 1, map epoch 2.
  const ShardMap next = *WithSlotsMoved(even, {0}, 1);
  const auto move = [&](const std::string& source, MoveSlotsResponse* out) {
    return MoveSlots((*cluster)[1].address, source, 0, next, out);
  };
  const auto epoch_served = [&] {
    auto stub = ParameterServer::NewStub(MakeChannel((*cluster)[1].address));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    StatusResponse status;
    REQUIRE(stub->Status(&ctx, StatusRequest(), &status).ok());
    return status.map().epoch();
  };
  MoveSlotsResponse r;
  const grpc::Status lost = move("127.0.0.1:1", &r);
  INFO(lost.error_message());
  REQUIRE(lost.error_code() == grpc::StatusCode::UNAVAILABLE);
  // Nothing moved; psctl plans the same map (epoch 2) again, and with the
  // source back the move goes through (it was refused as "tried already").
  REQUIRE(epoch_served() == 1);
  const grpc::Status moved = move((*cluster)[0].address, &r);
  INFO(moved.error_message());
  REQUIRE(moved.ok());
  CHECK(r.slots() == 1);
  CHECK(epoch_served() == 2);
}

// A source whose copy rounds hold nothing and whose fenced round fails:
// the destination aborts a move after its fenced round.
class FencedRoundFails final : public SlotMoves::Service {
 public:
  grpc::Status ExportSlots(grpc::ServerContext* /*ctx*/,
                           const ExportSlotsRequest* request,
                           grpc::ServerWriter<ExportSlotsChunk>* out) override {
    if (request->fence()) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "the fenced round fails here");
    }
    ExportSlotsChunk chunk;
    chunk.set_last(true);
    chunk.set_next_since(request->since() + 1);
    out->Write(chunk);
    return grpc::Status::OK;
  }
};

TEST_CASE(
    "a move aborted after its fenced round is tried again at the same map "
    "epoch only once no answer about it can be in flight",
    "[slots][moves]") {
  auto cluster = testing::StartPsCluster(2, {absl::StrCat("--num_slots=", 16)});
  REQUIRE_OK(cluster.status());
  FencedRoundFails fake;
  int fake_port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &fake_port);
  builder.RegisterService(&fake);
  std::unique_ptr<grpc::Server> fake_server = builder.BuildAndStart();
  REQUIRE(fake_port > 0);
  const ShardMap even = *ShardMap::EvenSlots(2, 16);
  // Slot 0 of shard 0 to shard 1, map epoch 2.
  const ShardMap next = *WithSlotsMoved(even, {0}, 1);
  const auto move = [&](const std::string& source) {
    return MoveSlots((*cluster)[1].address, source, 0, next);
  };
  const grpc::Status failed = move(absl::StrCat("127.0.0.1:", fake_port));
  const absl::Time aborted = absl::Now();  // the destination aborted before
  INFO(failed.error_message());
  REQUIRE(failed.error_code() == grpc::StatusCode::UNAVAILABLE);
  // At once: refused (a fenced source may still hear about the first try).
  const grpc::Status early = move((*cluster)[0].address);
  INFO(early.error_message());
  if (absl::Now() - aborted < absl::Seconds(3)) {
    REQUIRE(early.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
    CHECK(early.error_message().find("tried already") != std::string::npos);
  }
  // After two fence timeouts (2 s each): tried again, and it moves.
  absl::SleepFor(absl::Seconds(4.5) - (absl::Now() - aborted));
  const grpc::Status moved = move((*cluster)[0].address);
  INFO(moved.error_message());
  REQUIRE(moved.ok());
  fake_server->Shutdown();
}

TEST_CASE(
    "a move is refused while the tensor of its slices exists on the "
    "destination only (its creation has not reached the source)",
    "[slots][moves]") {
  auto cluster = testing::StartPsCluster(2, {absl::StrCat("--num_slots=", 16)});
  REQUIRE_OK(cluster.status());
  const TensorSpec spec =
      testing::ConstantSpec("late", {64}, 1.0f, testing::SgdSpec(1.0f), 16);
  const ShardMap even = *ShardMap::EvenSlots(2, 16);
  const uint32_t slot = even.SliceSlot("late", 0);
  const int from = even.owners()[slot];
  const int to = 1 - from;
  const auto create = [&](int shard) {
    auto stub =
        ParameterServer::NewStub(MakeChannel((*cluster)[shard].address));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    CreateTensorRequest request;
    *request.add_tensors() = spec;
    CreateTensorResponse response;
    const grpc::Status st = stub->CreateTensor(&ctx, request, &response);
    INFO(st.error_message());
    REQUIRE(st.ok());
  };
  const ShardMap next = *WithSlotsMoved(even, {slot}, to);
  const auto move = [&] {
    return MoveSlots((*cluster)[to].address, (*cluster)[from].address, from,
                     next);
  };
  // Created on the destination only: moved on, the slot's slices of
  // "late" would exist on no shard.
  create(to);
  const grpc::Status refused = move();
  INFO(refused.error_message());
  REQUIRE(refused.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(refused.error_message().find("not on the source") != std::string::npos);
  // Once the creation reached the source, the same move goes through.
  create(from);
  const grpc::Status moved = move();
  INFO(moved.error_message());
  REQUIRE(moved.ok());
}

TEST_CASE(
    "ps_server --move_copy_mb_s paces the copy rounds before the fence; bad "
    "values exit 2",
    "[slots][moves]") {
  for (const char* bad : {"--move_copy_mb_s=-1", "--move_copy_mb_s=nan"}) {
    absl::StatusOr<testing::ToolRun> run =
        testing::RunTool("server/ps_server", {bad});
    REQUIRE_OK(run.status());
    INFO(run->output);
    CHECK(run->exit_code == 2);
    CHECK(run->output.find("--move_copy_mb_s") != std::string::npos);
  }
  constexpr double kRate = 20;  // MB/s
  auto cluster = testing::StartPsCluster(
      2, {"--num_slots=16", absl::StrCat("--move_copy_mb_s=", kRate)});
  REQUIRE_OK(cluster.status());
  std::unique_ptr<PsClient> c = testing::ClusterClient(*cluster);
  REQUIRE_OK(c->WaitForShards(absl::Seconds(30)));
  // 32 MiB of values, half of them on each shard.
  REQUIRE_OK(c->CreateTensors({testing::ConstantSpec(
      "paced", {int64_t{8} << 20}, 2.0f, testing::SgdSpec(1.0f), 1 << 14)}));
  const ShardMap even = *ShardMap::EvenSlots(2, 16);
  std::vector<uint32_t> slots;
  for (uint32_t s = 0; s < 16; ++s) {
    if (even.owners()[s] == 0) slots.push_back(s);
  }
  const ShardMap next = *WithSlotsMoved(even, slots, 1);
  MoveSlotsResponse out;
  const grpc::Status moved =
      MoveSlots((*cluster)[1].address, (*cluster)[0].address, 0, next, &out);
  INFO(moved.error_message());
  REQUIRE(moved.ok());
  INFO("state bytes " << out.state_bytes() << ", first round "
                      << out.first_round_ms() << " ms");
  REQUIRE(out.state_bytes() > 8u << 20);
  // Every chunk but the round's last (4 MiB at most) waited for the pace.
  const double floor_ms = (static_cast<double>(out.state_bytes()) - (4 << 20)) /
                          (kRate * 1e6) * 1e3;
  CHECK(out.first_round_ms() >= floor_ms);
  // Moved whole: every value still 2.
  std::vector<float> values(size_t{8} << 20);
  REQUIRE_OK(
      c->StartPull(0, 0, PullSet{{{"paced", values.data()}}, {}})->Wait());
  CHECK(std::count(values.begin(), values.end(), 2.0f) ==
        static_cast<long>(values.size()));
}

}  // namespace
}  // namespace asyncps
