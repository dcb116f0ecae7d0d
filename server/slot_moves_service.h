#ifndef ASYNCPS_SERVER_SLOT_MOVES_SERVICE_H_
#define ASYNCPS_SERVER_SLOT_MOVES_SERVICE_H_

// The SlotMoves service of a shard (proto/slot_moves.proto): the gRPC face
// of its SlotMover (server/slot_mover.h), which does the moving. psctl
// calls MoveSlots and AdoptMap; shards call ExportSlots, FinishMove and
// MoveState on each other.
//
// Example (ps_server registers it next to the ParameterServer service; the
// cluster token guards it like every other call):
//
//   SlotMovesService moves(&mover);
//   builder.RegisterService(&moves);
//
// Runs on gRPC's synchronous threads: a move waits for the pushes being
// applied (the push gate) and for the other shard, which a callback
// reactor must not.

#include "proto/slot_moves.grpc.pb.h"
#include "server/slot_mover.h"

namespace asyncps {

// Thread-safe (as the mover).
class SlotMovesService final : public SlotMoves::Service {
 public:
  // `mover` is not owned and outlives the service.
  explicit SlotMovesService(SlotMover* mover) : mover_(mover) {}

  grpc::Status MoveSlots(grpc::ServerContext* ctx,
                         const MoveSlotsRequest* request,
                         MoveSlotsResponse* response) override;
  grpc::Status ExportSlots(
      grpc::ServerContext* ctx, const ExportSlotsRequest* request,
      grpc::ServerWriter<ExportSlotsChunk>* writer) override;
  grpc::Status FinishMove(grpc::ServerContext* ctx,
                          const FinishMoveRequest* request,
                          FinishMoveResponse* response) override;
  grpc::Status MoveState(grpc::ServerContext* ctx,
                         const MoveStateRequest* request,
                         MoveStateResponse* response) override;
  // The map in the request (malformed: INVALID_ARGUMENT), adopted as
  // SlotMover::Adopt says; answers the map served now.
  grpc::Status AdoptMap(grpc::ServerContext* ctx,
                        const AdoptMapRequest* request,
                        AdoptMapResponse* response) override;
  // This shard as the run's map keeper: its own map record
  // (server/map_record_store.h). Another run's id is FAILED_PRECONDITION; a
  // record whose maps do not parse INVALID_ARGUMENT (nothing written).
  grpc::Status ReadMapRecord(grpc::ServerContext* ctx,
                             const ReadMapRecordRequest* request,
                             VersionedMapRecord* response) override;
  grpc::Status SwapMapRecord(grpc::ServerContext* ctx,
                             const SwapMapRecordRequest* request,
                             SwapMapRecordResponse* response) override;

 private:
  SlotMover* const mover_;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_SLOT_MOVES_SERVICE_H_
