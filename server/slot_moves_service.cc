#include "server/slot_moves_service.h"

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

}  // namespace asyncps
