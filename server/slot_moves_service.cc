#include "server/slot_moves_service.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/fast_frame.h"
#include "common/grpc_status.h"
#include "common/shard_map_proto.h"
#include "server/write_waiter.h"

namespace asyncps {

namespace {

grpc::Status TooManyCalls() {
  return grpc::Status(
      grpc::StatusCode::RESOURCE_EXHAUSTED,
      absl::StrCat("this shard runs ", SlotMovesService::kMaxCalls,
                   " SlotMoves calls at once already; retry later"));
}

// ExportSlots: the export runs on a call thread and sends each chunk,
// waiting until it is written (the flow control of the sender's stream).
class ExportReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit ExportReactor(grpc::CallbackServerContext* ctx) : ctx_(ctx) {}

  // On the call thread; false once the call is gone.
  bool Write(const ExportSlotsChunk& chunk) {
    if (ctx_->IsCancelled()) return false;
    buffer_ = SerializeToByteBuffer(chunk);
    writes_.Started();
    StartWrite(&buffer_);
    return writes_.Wait();
  }

  void OnWriteDone(bool ok) override { writes_.Done(ok); }
  void OnDone() override { delete this; }

 private:
  grpc::CallbackServerContext* const ctx_;
  grpc::ByteBuffer buffer_;
  WriteWaiter writes_;
};

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

SlotMovesService::SlotMovesService(SlotMover* mover)
    : mover_(mover), calls_(kMaxCalls) {}

SlotMovesService::~SlotMovesService() { calls_.Shutdown(); }

template <typename Request, typename Response, typename Body>
grpc::ServerUnaryReactor* SlotMovesService::Unary(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
    grpc::ByteBuffer* out, Body body) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  // `in` and `out` live until Finish.
  if (!calls_.TryRun([reactor, in, out, body] {
        reactor->Finish(
            ToGrpcStatus(AnswerBytes<Request, Response>(*in, out, body)));
      })) {
    reactor->Finish(TooManyCalls());
  }
  return reactor;
}

grpc::ServerUnaryReactor* SlotMovesService::MoveSlots(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
    grpc::ByteBuffer* out) {
  return Unary<MoveSlotsRequest, MoveSlotsResponse>(
      ctx, in, out,
      [this](const MoveSlotsRequest& request, MoveSlotsResponse* response) {
        absl::StatusOr<MoveSlotsResponse> done = mover_->MoveIn(request);
        if (!done.ok()) return done.status();
        *response = *std::move(done);
        return absl::OkStatus();
      });
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* SlotMovesService::ExportSlots(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in) {
  auto* reactor = new ExportReactor(ctx);
  auto request = std::make_shared<ExportSlotsRequest>();
  if (absl::Status s = ParseFromByteBuffer(*in, request.get()); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  if (!calls_.TryRun([this, reactor, request] {
        const absl::Status s =
            mover_->Export(*request, [reactor](const ExportSlotsChunk& chunk) {
              return reactor->Write(chunk);
            });
        reactor->Finish(ToGrpcStatus(s));
      })) {
    reactor->Finish(TooManyCalls());
  }
  return reactor;
}

grpc::ServerUnaryReactor* SlotMovesService::FinishMove(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
    grpc::ByteBuffer* out) {
  return Unary<FinishMoveRequest, FinishMoveResponse>(
      ctx, in, out,
      [this](const FinishMoveRequest& request, FinishMoveResponse*) {
        return mover_->Finish(request);
      });
}

grpc::ServerUnaryReactor* SlotMovesService::MoveState(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
    grpc::ByteBuffer* out) {
  return Unary<MoveStateRequest, MoveStateResponse>(
      ctx, in, out,
      [this](const MoveStateRequest& request, MoveStateResponse* response) {
        absl::StatusOr<MoveStateResponse> state = mover_->State(request);
        if (!state.ok()) return state.status();
        *response = *std::move(state);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* SlotMovesService::AdoptMap(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
    grpc::ByteBuffer* out) {
  return Unary<AdoptMapRequest, AdoptMapResponse>(
      ctx, in, out,
      [this](const AdoptMapRequest& request, AdoptMapResponse* response) {
        absl::StatusOr<ShardMap> next = ShardMapFromProto(request.map());
        if (next.ok()) next = mover_->Adopt(*next, request.remake_lost());
        if (!next.ok()) return next.status();
        ShardMapToProto(*next, response->mutable_map());
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* SlotMovesService::ReadMapRecord(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
    grpc::ByteBuffer* out) {
  return Unary<ReadMapRecordRequest, VersionedMapRecord>(
      ctx, in, out,
      [this](const ReadMapRecordRequest& request,
             VersionedMapRecord* response) {
        absl::StatusOr<MapRecordStore*> record =
            mover_->KeeperRecord(request.run_id());
        absl::StatusOr<VersionedMapRecord> now =
            record.ok() ? (*record)->Read() : record.status();
        if (!now.ok()) return now.status();
        *response = *std::move(now);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* SlotMovesService::SwapMapRecord(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
    grpc::ByteBuffer* out) {
  return Unary<SwapMapRecordRequest, SwapMapRecordResponse>(
      ctx, in, out,
      [this](const SwapMapRecordRequest& request,
             SwapMapRecordResponse* response) {
        absl::StatusOr<MapRecordStore*> record =
            mover_->KeeperRecord(request.run_id());
        if (!record.ok()) return record.status();
        if (absl::Status s = CheckRecord(request.record()); !s.ok()) return s;
        absl::StatusOr<SwapMapRecordResponse> swap =
            (*record)->Swap(request.record(), request.expected_version());
        if (!swap.ok()) return swap.status();
        *response = *std::move(swap);
        return absl::OkStatus();
      });
}

}  // namespace asyncps
