#ifndef ASYNCPS_SERVER_PS_SERVICE_H_
#define ASYNCPS_SERVER_PS_SERVICE_H_

#include <functional>
#include <memory>
#include <string>

#include <grpcpp/support/byte_buffer.h>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/float_codec.h"
#include "absl/time/time.h"
#include "proto/asyncps.grpc.pb.h"
#include "server/checkpointer.h"
#include "server/push_dedup.h"
#include "server/shard_stats.h"
#include "server/shard_store.h"
#include "server/worker_table.h"
#include "spdlog/spdlog.h"

namespace asyncps {

// What the service reports about itself in Status.
struct ServiceIdentity {
  int shard_index = 0;
  int num_shards = 1;
  std::string build_version;
  StalenessPolicy policy;
};

// The ParameterServer gRPC service of one shard, on gRPC's callback API.
// Handlers validate input, then work on the store; a pull that must wait for
// slower workers registers a callback with the WorkerTable and returns, so no
// gRPC thread is held while it waits. absl::Status becomes grpc::Status here
// and nowhere else on the server.
//
// PullFast and PushFast are raw methods (grpc::ByteBuffer in and out) in the
// framing of common/fast_frame.h: gradients are validated and applied in
// place from gRPC's receive buffers, pulled values are copied once, under
// the slice lock, into the slices that are sent. They share every step after
// the framing with Pull and Push.
//
// Checkpoint hands the write to the Checkpointer's thread and finishes the
// call from there.
//
// Thread-safe. The store, table, stats and checkpointer are not owned and
// must outlive it.
class PsService final
    : public ParameterServer::WithRawCallbackMethod_PullFast<
          ParameterServer::WithRawCallbackMethod_PushFast<
              ParameterServer::CallbackService>> {
 public:
  // `checkpointer` is null when checkpoints are off; `restored_from` is the
  // checkpoint the store was loaded from (empty when none), for Status.
  PsService(ServiceIdentity identity, ShardStore* store, WorkerTable* workers,
            ShardStats* stats, StalenessRule rule,
            std::shared_ptr<spdlog::logger> logger,
            Checkpointer* checkpointer = nullptr,
            CheckpointInfo restored_from = CheckpointInfo());

  grpc::ServerUnaryReactor* CreateTensor(
      grpc::CallbackServerContext* ctx, const CreateTensorRequest* request,
      CreateTensorResponse* response) override;
  grpc::ServerUnaryReactor* ListTensors(grpc::CallbackServerContext* ctx,
                                        const ListTensorsRequest* request,
                                        ListTensorsResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const HeartbeatRequest* request,
                                      HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* ctx,
                                 const PullRequest* request,
                                 PullResponse* response) override;
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* ctx,
                                 const PushRequest* request,
                                 PushResponse* response) override;
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx,
                                   const StatusRequest* request,
                                   StatusResponse* response) override;
  // Answers once the checkpoint is durable (or failed); FAILED_PRECONDITION
  // when checkpoints are off.
  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* ctx,
                                       const CheckpointRequest* request,
                                       CheckpointResponse* response) override;
  // Request: a serialized PullRequest. Response: a frame (PullResponse
  // header, then every slice's values).
  grpc::ServerUnaryReactor* PullFast(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  // Request: a frame (PushRequest header, then every gradient).
  // Response: a serialized PushResponse.
  grpc::ServerUnaryReactor* PushFast(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;

  // The Status RPC's answer, also used by the metrics endpoint.
  void FillStatus(StatusResponse* response);

  // The address is known only once the server has bound its port.
  void set_address(const std::string& address) {
    absl::MutexLock l(&mu_);
    address_ = address;
  }

 private:
  // Copies a pull's slices into the response once the pull may go ahead;
  // gets the time waited, returns the payload bytes copied.
  using PullCopy = std::function<absl::StatusOr<uint64_t>(int64_t waited_us)>;

  // Pull and PullFast after parsing: validates the pull, renews the worker,
  // waits (without a thread) for the consistency model, then runs copy_out
  // and finishes the call. `request` need only live until this returns.
  grpc::ServerUnaryReactor* StartPull(grpc::CallbackServerContext* ctx,
                                      const PullRequest& request,
                                      PullCopy copy_out);
  // Push and PushFast after parsing: validates the worker and every
  // gradient (grads[i] is the payload of request.grads(i)), applies the push
  // once per (worker, incarnation, seq), records it and the worker's clock.
  absl::Status DoPush(const PushRequest& request,
                      absl::Span<const FloatPayload> grads,
                      PushResponse* response);

  const ServiceIdentity identity_;
  ShardStore* const store_;
  WorkerTable* const workers_;
  ShardStats* const stats_;
  const StalenessRule rule_;
  const std::shared_ptr<spdlog::logger> logger_;
  const absl::Time start_time_;
  Checkpointer* const checkpointer_;
  const CheckpointInfo restored_from_;
  PushDedup dedup_;
  absl::Mutex mu_;
  std::string address_ ABSL_GUARDED_BY(mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_PS_SERVICE_H_
