#include "server/slot_moves_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/shard_map_proto.h"

namespace asyncps {

namespace {

grpc::Status NotYet(const char* method) {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                      absl::StrCat("SlotMoves.", method,
                                   " is not implemented by this shard yet"));
}

}  // namespace

SlotMovesService::SlotMovesService(SlotMovesOptions options)
    : options_(std::move(options)) {}

absl::Status SlotMovesService::CheckAdoptable(const ShardMap& current,
                                              const ShardMap& next, int shard) {
  if (!current.slotted()) {
    return absl::FailedPreconditionError(
        absl::StrCat("this shard serves the ", current.DebugString(),
                     ": maps change only in a slotted run (--num_slots)"));
  }
  if (!next.slotted() || next.num_shards() != current.num_shards() ||
      next.num_slots() != current.num_slots()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ", next.DebugString(), " is not a map of this run (",
        current.num_slots(), " slots over ", current.num_shards(), " shards)"));
  }
  if (next.epoch() < current.epoch() ||
      (next.epoch() == current.epoch() && next != current)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the map of epoch ", next.epoch(), " is not newer than the ",
        current.DebugString(), " this shard serves"));
  }
  const auto before = current.owners();
  const auto after = next.owners();
  for (size_t s = 0; s < before.size(); ++s) {
    const bool had = before[s] == shard;
    if (had != (after[s] == shard)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the map of epoch ", next.epoch(), " gives slot ", s, " to shard ",
          after[s], " instead of shard ", before[s],
          ": AdoptMap leaves this shard's slots as they are (moving slots is "
          "MoveSlots)"));
    }
  }
  return absl::OkStatus();
}

absl::Status SlotMovesService::Adopt(const ShardMap& next) {
  absl::MutexLock l(&mu_);
  const ShardMap current = options_.store->map();
  absl::Status s = CheckAdoptable(current, next, options_.shard_index);
  if (!s.ok() || next == current) return s;
  {
    // No push between its map check and its last slice.
    PushGate::Closed closed(options_.gate);
    s = options_.store->AdoptMap(next);
  }
  if (s.ok()) {
    options_.logger->info("serving the {} (was epoch {})", next.DebugString(),
                          current.epoch());
  }
  return s;
}

grpc::Status SlotMovesService::AdoptMap(grpc::ServerContext* /*ctx*/,
                                        const AdoptMapRequest* request,
                                        AdoptMapResponse* response) {
  absl::StatusOr<ShardMap> next = ShardMapFromProto(request->map());
  absl::Status s = next.status();
  if (s.ok()) s = Adopt(*next);
  if (!s.ok()) {
    options_.logger->warn("AdoptMap refused: {}", s.ToString());
    return ToGrpcStatus(s);
  }
  ShardMapToProto(options_.store->map(), response->mutable_map());
  return grpc::Status::OK;
}

// The move itself is the move orchestration's (not built yet).
grpc::Status SlotMovesService::MoveSlots(grpc::ServerContext*,
                                         const MoveSlotsRequest*,
                                         MoveSlotsResponse*) {
  return NotYet("MoveSlots");
}

// The source's copy rounds come with the move orchestration.
grpc::Status SlotMovesService::ExportSlots(
    grpc::ServerContext*, const ExportSlotsRequest*,
    grpc::ServerWriter<ExportSlotsChunk>*) {
  return NotYet("ExportSlots");
}

// The source's end of a move comes with the move orchestration.
grpc::Status SlotMovesService::FinishMove(grpc::ServerContext*,
                                          const FinishMoveRequest*,
                                          FinishMoveResponse*) {
  return NotYet("FinishMove");
}

// The destination's decision comes with the move orchestration.
grpc::Status SlotMovesService::MoveState(grpc::ServerContext*,
                                         const MoveStateRequest*,
                                         MoveStateResponse*) {
  return NotYet("MoveState");
}

}  // namespace asyncps
