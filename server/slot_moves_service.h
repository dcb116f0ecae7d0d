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
// Every method takes its request as bytes: parsed only once its cost in
// memory is known to be bounded (common/parse_cost.h; gRPC's typed parse
// of 64 MiB of empty unknown fields sent to MoveState took a shard to
// 2.2 GB), and a request that does not parse is INVALID_ARGUMENT. Each call
// then runs on a thread of its own (a move waits for the pushes being
// applied and for the other shard, which gRPC's callback threads must
// not), at most kMaxCalls at once: beyond, RESOURCE_EXHAUSTED.

#include "common/task_threads.h"
#include "proto/slot_moves.grpc.pb.h"
#include "server/slot_mover.h"

namespace asyncps {

using RawSlotMovesService = SlotMoves::WithRawCallbackMethod_MoveSlots<
    SlotMoves::WithRawCallbackMethod_ExportSlots<
        SlotMoves::WithRawCallbackMethod_FinishMove<
            SlotMoves::WithRawCallbackMethod_MoveState<
                SlotMoves::WithRawCallbackMethod_AdoptMap<
                    SlotMoves::WithRawCallbackMethod_ReadMapRecord<
                        SlotMoves::WithRawCallbackMethod_SwapMapRecord<
                            SlotMoves::Service>>>>>>>;

// Thread-safe (as the mover).
class SlotMovesService final : public RawSlotMovesService {
 public:
  static constexpr int kMaxCalls = 64;

  // `mover` is not owned and outlives the service.
  explicit SlotMovesService(SlotMover* mover);
  // Waits for the calls still running (the server shut down first).
  ~SlotMovesService() override;

  grpc::ServerUnaryReactor* MoveSlots(grpc::CallbackServerContext* ctx,
                                      const grpc::ByteBuffer* in,
                                      grpc::ByteBuffer* out) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* ExportSlots(
      grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in) override;
  grpc::ServerUnaryReactor* FinishMove(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* in,
                                       grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* MoveState(grpc::CallbackServerContext* ctx,
                                      const grpc::ByteBuffer* in,
                                      grpc::ByteBuffer* out) override;
  // The map in the request (malformed: INVALID_ARGUMENT), adopted as
  // SlotMover::Adopt says; answers the map served now.
  grpc::ServerUnaryReactor* AdoptMap(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* in,
                                     grpc::ByteBuffer* out) override;
  // This shard as the run's map keeper: its own map record
  // (server/map_record_store.h). Another run's id is FAILED_PRECONDITION; a
  // record whose maps do not parse INVALID_ARGUMENT (nothing written).
  grpc::ServerUnaryReactor* ReadMapRecord(grpc::CallbackServerContext* ctx,
                                          const grpc::ByteBuffer* in,
                                          grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* SwapMapRecord(grpc::CallbackServerContext* ctx,
                                          const grpc::ByteBuffer* in,
                                          grpc::ByteBuffer* out) override;

 private:
  // On a call thread: parses the request, runs body(request, &response)
  // and answers (AnswerBytes, common/fast_frame.h).
  template <typename Request, typename Response, typename Body>
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx,
                                  const grpc::ByteBuffer* in,
                                  grpc::ByteBuffer* out, Body body);

  SlotMover* const mover_;
  TaskThreads calls_;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_SLOT_MOVES_SERVICE_H_
