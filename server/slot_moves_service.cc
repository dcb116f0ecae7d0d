#include "server/slot_moves_service.h"

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/shard_map_proto.h"

namespace asyncps {

grpc::Status SlotMovesService::MoveSlots(grpc::ServerContext* /*ctx*/,
                                         const MoveSlotsRequest* request,
                                         MoveSlotsResponse* response) {
  absl::StatusOr<MoveSlotsResponse> done = mover_->MoveIn(*request);
  if (!done.ok()) return ToGrpcStatus(done.status());
  *response = *std::move(done);
  return grpc::Status::OK;
}

grpc::Status SlotMovesService::ExportSlots(
    grpc::ServerContext* ctx, const ExportSlotsRequest* request,
    grpc::ServerWriter<ExportSlotsChunk>* writer) {
  return ToGrpcStatus(
      mover_->Export(*request, [ctx, writer](const ExportSlotsChunk& chunk) {
        return !ctx->IsCancelled() && writer->Write(chunk);
      }));
}

grpc::Status SlotMovesService::FinishMove(grpc::ServerContext* /*ctx*/,
                                          const FinishMoveRequest* request,
                                          FinishMoveResponse* /*response*/) {
  return ToGrpcStatus(mover_->Finish(*request));
}

grpc::Status SlotMovesService::MoveState(grpc::ServerContext* /*ctx*/,
                                         const MoveStateRequest* request,
                                         MoveStateResponse* response) {
  absl::StatusOr<MoveStateResponse> state = mover_->State(*request);
  if (!state.ok()) return ToGrpcStatus(state.status());
  *response = *std::move(state);
  return grpc::Status::OK;
}

grpc::Status SlotMovesService::AdoptMap(grpc::ServerContext* /*ctx*/,
                                        const AdoptMapRequest* request,
                                        AdoptMapResponse* response) {
  absl::StatusOr<ShardMap> next = ShardMapFromProto(request->map());
  if (next.ok()) next = mover_->Adopt(*next);
  if (!next.ok()) return ToGrpcStatus(next.status());
  ShardMapToProto(*next, response->mutable_map());
  return grpc::Status::OK;
}

namespace {

absl::Status CheckRecord(const MapRecord& record) {
  if (record.has_committed()) {
    if (absl::Status s = ShardMapFromProto(record.committed()).status();
        !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the record's committed map: ", s.message()));
    }
  }
  if (record.has_pending()) {
    absl::StatusOr<ShardMap> next =
        ShardMapFromProto(record.pending().next_map());
    if (!next.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the record's pending move: ", next.status().message()));
    }
    const int to = record.pending().destination_index();
    if (to < 0 || to >= next->num_shards() ||
        record.pending().destination().empty()) {
      return absl::InvalidArgumentError(
          "the record's pending move names no destination of its map");
    }
  }
  return absl::OkStatus();
}

}  // namespace

grpc::Status SlotMovesService::ReadMapRecord(
    grpc::ServerContext* /*ctx*/, const ReadMapRecordRequest* request,
    VersionedMapRecord* response) {
  absl::StatusOr<MapRecordStore*> record =
      mover_->KeeperRecord(request->run_id());
  absl::StatusOr<VersionedMapRecord> now =
      record.ok() ? (*record)->Read() : record.status();
  if (!now.ok()) return ToGrpcStatus(now.status());
  *response = *std::move(now);
  return grpc::Status::OK;
}

grpc::Status SlotMovesService::SwapMapRecord(
    grpc::ServerContext* /*ctx*/, const SwapMapRecordRequest* request,
    SwapMapRecordResponse* response) {
  absl::StatusOr<MapRecordStore*> record =
      mover_->KeeperRecord(request->run_id());
  if (!record.ok()) return ToGrpcStatus(record.status());
  if (absl::Status s = CheckRecord(request->record()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  absl::StatusOr<SwapMapRecordResponse> swap =
      (*record)->Swap(request->record(), request->expected_version());
  if (!swap.ok()) return ToGrpcStatus(swap.status());
  *response = *std::move(swap);
  return grpc::Status::OK;
}

}  // namespace asyncps
