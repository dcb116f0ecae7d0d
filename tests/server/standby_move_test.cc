// A move to a standby shard in one process (two PsServers on port 0): a
// run started with --serving_shards=1 of 2, the tensor created, a schedule
// step set and two workers heard only by shard 0; a move gives shard 1
// slots. Shard 1 then holds the tensor (durable in its spec file), the
// schedule step and both workers' clocks, which its SSP/BSP waits need.

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "common/map_change.h"
#include "common/net.h"
#include "common/shard_map_proto.h"
#include "proto/asyncps.grpc.pb.h"
#include "proto/slot_moves.grpc.pb.h"
#include "server/ps_server.h"
#include "server/spec_file.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/tensor_specs.h"

namespace asyncps {
namespace {

constexpr char kRun[] = "run-standby";
constexpr int kSlots = 8;

std::unique_ptr<PsServer> StartShard(int index, const std::string& dir) {
  PsServerOptions o;
  o.host = "127.0.0.1";
  o.store.shard_index = index;
  o.store.num_shards = 2;
  o.num_slots = kSlots;
  o.serving_shards = 1;
  o.workers.consistency = BSP;
  o.checkpoint_dir = dir;
  o.run_id = kRun;
  o.logger = NullLogger();
  absl::StatusOr<std::unique_ptr<PsServer>> s = PsServer::Start(std::move(o));
  REQUIRE_OK(s.status());
  return *std::move(s);
}

std::string Address(const PsServer& s) {
  return "127.0.0.1:" + std::to_string(s.port());
}

void Heartbeat(ParameterServer::Stub* stub, int id, uint64_t incarnation,
               int64_t clock) {
  HeartbeatRequest request;
  request.mutable_worker()->set_worker_id(id);
  request.mutable_worker()->set_incarnation(incarnation);
  request.mutable_worker()->set_clock(clock);
  request.set_run_id(kRun);
  HeartbeatResponse response;
  grpc::ClientContext ctx;
  REQUIRE(stub->Heartbeat(&ctx, request, &response).ok());
}

TEST_CASE(
    "a standby shard gets the tensor, its schedule and the workers' clocks "
    "with its first slots",
    "[slot_moves][scale]") {
  std::unique_ptr<PsServer> serving = StartShard(0, "");
  const std::string dir = testing::MakeTmpDir("standby");
  std::unique_ptr<PsServer> standby = StartShard(1, dir);
  const ShardMap start = *ShardMapOr(standby->GetStatus().map(), 2);
  REQUIRE(start.SlicesOn("w", 16, 1) == 0);

  auto ps = ParameterServer::NewStub(MakeChannel(Address(*serving)));
  CreateTensorRequest create;
  *create.add_tensors() =
      testing::ConstantSpec("w", {64}, 1.0f, testing::SgdSpec(0.1f), 4);
  {
    grpc::ClientContext ctx;
    CreateTensorResponse r;
    REQUIRE(ps->CreateTensor(&ctx, create, &r).ok());
  }
  {
    SetLearningRateRequest request;
    LearningRate* rate = request.add_rates();
    rate->set_name("w");
    rate->set_learning_rate(0.05f);
    rate->set_step(2);
    grpc::ClientContext ctx;
    SetLearningRateResponse r;
    REQUIRE(ps->SetLearningRate(&ctx, request, &r).ok());
  }
  // The slow one first: a worker that joins later starts no lower.
  Heartbeat(ps.get(), 1, 21, 2);
  Heartbeat(ps.get(), 0, 11, 5);

  MoveSlotsRequest move;
  move.set_source(Address(*serving));
  move.set_source_index(0);
  move.set_destination(Address(*standby));
  ShardMapToProto(*WithSlotsMoved(start, {1, 3, 5, 7}, 1),
                  move.mutable_next_map());
  auto moves = SlotMoves::NewStub(MakeChannel(Address(*standby)));
  MoveSlotsResponse moved;
  grpc::ClientContext ctx;
  const grpc::Status s = moves->MoveSlots(&ctx, move, &moved);
  INFO(s.error_message());
  REQUIRE(s.ok());

  const StatusResponse status = standby->GetStatus();
  CHECK(status.map().epoch() == start.epoch() + 1);
  CHECK(status.tensors() == 1);
  CHECK(status.slices() > 0);
  REQUIRE(status.workers_size() == 2);
  CHECK(status.workers(0).incarnation() == 11);
  CHECK(status.workers(0).clock() == 5);
  CHECK(status.workers(1).clock() == 2);
  CHECK(status.workers(1).live());
  // The created tensor and its schedule are durable, as a created one's.
  const absl::StatusOr<SpecFileContents> specs =
      ReadSpecFile(SpecFilePath(dir, 1, 2));
  REQUIRE_OK(specs.status());
  REQUIRE(specs->tensors.size() == 1);
  CHECK(specs->tensors[0].name() == "w");
  CHECK(specs->tensors[0].optimizer().schedule_step() == 2);
}

}  // namespace
}  // namespace asyncps
