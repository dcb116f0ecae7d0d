#ifndef ASYNCPS_SERVER_SLOT_MOVES_SERVICE_H_
#define ASYNCPS_SERVER_SLOT_MOVES_SERVICE_H_

// The SlotMoves service of a shard (proto/slot_moves.proto): live slot
// moves between the shards of a slotted run. For now it answers AdoptMap
// only: psctl (or a test) hands a shard a newer map that leaves this
// shard's own slots as they are, and the shard serves it from then on;
// requests routed with the older map are refused with the new one
// (CallStatus.map) and clients route them again by it. The moves
// themselves (MoveSlots, ExportSlots, FinishMove, MoveState) answer
// UNIMPLEMENTED.
//
// Example (ps_server registers it next to the ParameterServer service; the
// cluster token guards it like every other call):
//
//   SlotMovesOptions o;
//   o.shard_index = 1;
//   o.store = store.get();  // its map is what the shard serves
//   o.gate = &gate;         // closed while the map changes
//   o.logger = logger;
//   SlotMovesService moves(o);
//   builder.RegisterService(&moves);
//
// Runs on gRPC's synchronous threads: an adoption waits for the pushes
// being applied (the push gate), which a callback reactor must not.

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/shard_map.h"
#include "proto/slot_moves.grpc.pb.h"
#include "server/push_gate.h"
#include "spdlog/spdlog.h"
#include "store/shard_store.h"

namespace asyncps {

struct SlotMovesOptions {
  int shard_index = 0;
  ShardStore* store = nullptr;             // not owned; required
  PushGate* gate = nullptr;                // not owned; required
  std::shared_ptr<spdlog::logger> logger;  // required
};

// Thread-safe: adoptions are serialised; everything else is const.
class SlotMovesService final : public SlotMoves::Service {
 public:
  explicit SlotMovesService(SlotMovesOptions options);

  // OK when shard `shard`, serving `current`, may serve `next` without
  // moving anything: a slotted map of the same shard and slot counts, at a
  // newer epoch, that gives `shard` exactly the slots it owns now.
  // INVALID_ARGUMENT for a map that is not one of this run (another shard
  // count or slot count, a static map), FAILED_PRECONDITION (naming the
  // epochs or the first slot that would change hands) otherwise.
  static absl::Status CheckAdoptable(const ShardMap& current,
                                     const ShardMap& next, int shard);

  // The map in the request (ShardMapProto; malformed: INVALID_ARGUMENT),
  // checked by CheckAdoptable and adopted with no push in between its
  // checks and its last slice (the push gate closed). The same map again is
  // OK (a retry). Answers the map served now.
  grpc::Status AdoptMap(grpc::ServerContext* ctx,
                        const AdoptMapRequest* request,
                        AdoptMapResponse* response) override;

  // Not built yet (the move orchestration comes next): UNIMPLEMENTED.
  grpc::Status MoveSlots(grpc::ServerContext* ctx,
                         const MoveSlotsRequest* request,
                         MoveSlotsResponse* response) override;
  // Not built yet: UNIMPLEMENTED.
  grpc::Status ExportSlots(
      grpc::ServerContext* ctx, const ExportSlotsRequest* request,
      grpc::ServerWriter<ExportSlotsChunk>* writer) override;
  // Not built yet: UNIMPLEMENTED.
  grpc::Status FinishMove(grpc::ServerContext* ctx,
                          const FinishMoveRequest* request,
                          FinishMoveResponse* response) override;
  // Not built yet: UNIMPLEMENTED.
  grpc::Status MoveState(grpc::ServerContext* ctx,
                         const MoveStateRequest* request,
                         MoveStateResponse* response) override;

 private:
  absl::Status Adopt(const ShardMap& next) ABSL_LOCKS_EXCLUDED(mu_);

  const SlotMovesOptions options_;
  // Serialises adoptions (the check and the change are one step).
  absl::Mutex mu_;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_SLOT_MOVES_SERVICE_H_
