#ifndef ASYNCPS_SERVER_PS_SERVICE_H_
#define ASYNCPS_SERVER_PS_SERVICE_H_

#include <grpcpp/support/byte_buffer.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "common/fast_frame.h"
#include "common/payload.h"
#include "proto/asyncps.grpc.pb.h"
#include "proto/replication.pb.h"
#include "server/entry_wire.h"
#include "server/service_context.h"
#include "server/slot_load_meter.h"
#include "spdlog/spdlog.h"
#include "store/shard_store.h"

namespace asyncps {

// Every method of asyncps.ParameterServer as a raw callback method: the
// service parses requests itself, so a request that does not parse is
// answered INVALID_ARGUMENT (and counted) like any other bad input instead
// of failing inside gRPC.
using RawParameterServerService = ParameterServer::WithRawCallbackMethod_CreateTensor<
    ParameterServer::WithRawCallbackMethod_ListTensors<
        ParameterServer::WithRawCallbackMethod_SetLearningRate<
            ParameterServer::WithRawCallbackMethod_Heartbeat<
                ParameterServer::WithRawCallbackMethod_Pull<
                    ParameterServer::WithRawCallbackMethod_Push<
                        ParameterServer::WithRawCallbackMethod_Status<
                            ParameterServer::WithRawCallbackMethod_PullStream<
                                ParameterServer::WithRawCallbackMethod_PushStream<
                                    ParameterServer::
                                        WithRawCallbackMethod_StepStream<
                                            ParameterServer::
                                                WithRawCallbackMethod_Checkpoint<
                                                    ParameterServer::
                                                        Service>>>>>>>>>>>;

// The ParameterServer gRPC service of one shard, on gRPC's callback API.
// Handlers validate input, then work on the store and the worker registry;
// absl::Status becomes grpc::Status here and nowhere else on the server.
//
// Pushes and pulls check their caller's worker reference first: a malformed
// one is INVALID_ARGUMENT whatever the request's tensors, rows or payload
// are (a reader's read_only pull names no worker).
//
// Pushes: the worker is identified (fencing) and the push's sequence number
// claimed (de-duplication) before its payload is looked at, so a retried
// duplicate costs no validation; then the whole push is validated (all or
// nothing) and applied slice by slice, in place from the bytes received,
// inside a PushGate pass so that checkpoints are consistent cuts.
//
// Pulls: a pull that must wait for slower workers registers a callback with
// the registry and returns, so no gRPC thread is held while it waits; its
// values are copied out (once, under each slice's lock, into the buffers
// that are sent) by the thread that releases it, or the registry's
// executor. A pull whose caller goes away is dropped from the waits.
//
// The streams (PullStream / PushStream / StepStream) carry the same requests,
// each answered by request_id, with payloads framed as in common/fast_frame.h;
// their reactors (server/data_streams.h) run the steps below.
//
// Thread-safe.
class PsService final : public RawParameterServerService {
 public:
  explicit PsService(ServiceContext context);
  ~PsService() override;  // waits for a state digest in progress

  grpc::ServerUnaryReactor* CreateTensor(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListTensors(grpc::CallbackServerContext* ctx,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;
  // Answers once the spec file (when checkpoints are on) holds the rates.
  grpc::ServerUnaryReactor* SetLearningRate(
      grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* ctx,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* ctx,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  // Answers once the checkpoint is durable (or failed); FAILED_PRECONDITION
  // when checkpoints are off.
  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* PullStream(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* PushStream(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* StepStream(
      grpc::CallbackServerContext* ctx) override;

  // The Status RPC's answer, also used by the metrics endpoint.
  void FillStatus(StatusResponse* response);
  // The map answers show (SlotFence::Shown): the one served, except while
  // a replicated destination's commit waits for its backups.
  ShardMap ShownMap() const {
    return c_.fence != nullptr ? c_.fence->Shown(c_.store->map())
                               : c_.store->map();
  }
  // StatusResponse.slot_load (a slotted map only).
  void FillSlotLoad(StatusResponse* response) const {
    slot_load_.Fill(response);
  }

  // The address is known only once the server has bound its port.
  void set_address(const std::string& address) {
    absl::MutexLock l(&mu_);
    address_ = address;
  }

  // ---- The steps shared by the unary methods and the streams.

  // Checks the caller (PushTransaction::CheckCaller) and identifies it
  // (fencing), claims the push's seq, validates every gradient (grads[i]
  // is the payload of request.grads(i), rows[k] of request.rows(k)) and
  // applies the push once per (worker, incarnation,
  // seq); records it. *needs_checkpoint says that the push was an assign
  // (or its retry) whose values no checkpoint holds yet: the answer waits
  // for one (WhenValuesDurable), as a creation with values does.
  absl::Status DoPush(const PushRequest& request,
                      absl::Span<const Payload> grads, PushResponse* response,
                      absl::Span<const Payload> rows, bool* needs_checkpoint);

  // Writes a checkpoint and calls done(OK) once it holds every value given
  // so far (by creations with values and assigns), or done(error) saying
  // that `what` holds on this shard but a restart would lose it. Only
  // when checkpoints are on.
  void WhenValuesDurable(absl::string_view what,
                         std::function<void(absl::Status)> done);

  // Creates the requested tensors and tables and makes their specs durable
  // (the spec file); *needs_checkpoint says that the request carried
  // INIT_VALUES tensors whose values no checkpoint holds yet: the answer
  // waits for one.
  // Makes the store's specs and schedules durable in the spec file (when
  // checkpoints are on); the error names `what` ("the tensors exist") as
  // what holds on this shard although a restart would lose it.
  absl::Status SyncSpecs(absl::string_view what);
  absl::StatusOr<CreateTensorResponse> DoCreate(
      const CreateTensorRequest& request, bool* needs_checkpoint);

  // Validates a pull, its caller first (a malformed worker reference is
  // INVALID_ARGUMENT whatever the tensors and rows are), and admits the
  // caller (a read_only pull admits nobody); *target is the clock the
  // consistency model waits for.
  absl::Status BeginPull(const PullRequest& request, int64_t* target);
  // BeginPull's checks alone (caller, routing, wire type, tensors and
  // rows), changing nothing but the bad-input counter: a StepStream request
  // checks its pull before its push is applied, so that a bad pull refuses
  // the whole step.
  absl::Status CheckPull(const PullRequest& request);
  // Calls `done` once the pull may be answered: at once for a read_only
  // pull, else as WorkerRegistry::WhenReady for its worker and `target`.
  WorkerRegistry::WaitId WhenReady(const PullRequest& request, int64_t target,
                                   WorkerRegistry::Callback done);

  // Copies the pulled slices and rows into a PullResponse (values in
  // `bytes`); rows that do not exist yet are created.
  absl::Status CopyPull(const PullRequest& request, PullResponse* response);
  // Copies the pulled slices and rows into a frame (PullResponse header,
  // payload in the request's wire_dtype); counts the bytes.
  absl::StatusOr<grpc::ByteBuffer> CopyPullFrame(const PullRequest& request,
                                                 PullResponse* header);

  // ---- Replication (ps_server --replicas; server/replication_log.h).

  // UNAVAILABLE on a backup or a fenced primary: a worker's calls go to the
  // shard's primary. OK when the shard is not replicated.
  absl::Status CheckPrimary() const;
  // Runs one state-changing step: `apply` at once (not replicated), or as
  // the next entry of the replication log, which carries entry() to the
  // backups; then answer(apply's status) once every counted backup holds
  // the entry, or answer(the log's refusal). entry() is called only when
  // replicated, before the log's lock is taken. `answer` may run on another
  // thread and must not block.
  // `through_earlier`: answer once the entries before this one are held
  // (a pull: what it read survives a failover; its own effects, a worker's
  // admission and rows created at their initial values, need not wait).
  void RunStep(absl::FunctionRef<MadeEntry()> entry,
               absl::FunctionRef<absl::Status()> apply,
               std::function<void(absl::Status)> answer,
               bool through_earlier = false);
  // RunStep of a push (DoPush), whose answer waits for a checkpoint when
  // DoPush says so. `response` must live until `answer` ran. `frames`: the
  // reader of the stream frame the payloads came from (its entry shares
  // their memory), null for a unary push (its entry copies them).
  void RunPushStep(const PushRequest& request, absl::Span<const Payload> grads,
                   absl::Span<const Payload> rows, const FrameReader* frames,
                   PushResponse* response,
                   std::function<void(absl::Status)> answer);
  // RunStep of a worker's pull's copy (a reader's pull is no step: it
  // changes nothing and is answered at once, also by a backup).
  void RunPullStep(const PullRequest& request,
                   absl::FunctionRef<absl::Status()> copy,
                   std::function<void(absl::Status)> answer);
  // A backup runs its primary's entry through the same steps as the
  // primary did (its answer is dropped; the primary's was the same), after
  // evicting the rows the primary evicted while it ran them. `outside`:
  // the entry's payloads when they came outside it (ReadFeedWire).
  absl::Status ApplyEntry(const LogEntry& entry,
                          const EntryPayloads* outside = nullptr);
  // The shard's own eviction round (rows idle for row_ttl_steps before
  // `clock`, room kept free under the cap), as a step: a replicated
  // primary logs the rows it evicts; a backup evicts only what its
  // primary's entries say. Returns the rows evicted.
  uint64_t RunEviction(int64_t clock);
  // The log entry of a push: its header, and its payloads outside it,
  // shared with `frames` (FrameReader::Share; those under 16 KiB copied),
  // or copied into it when `frames` is null.
  static MadeEntry PushEntry(const PushRequest& header,
                             absl::Span<const Payload> grads,
                             absl::Span<const Payload> rows,
                             const FrameReader* frames);
  // The steps of SetLearningRate and Heartbeat.
  absl::Status DoSetLearningRate(const SetLearningRateRequest& request,
                                 SetLearningRateResponse* response);
  absl::Status DoHeartbeat(const HeartbeatRequest& request,
                           HeartbeatResponse* response);
  // The group's shard epoch (PullResponse.shard_epoch): a backup takes its
  // primary's with the snapshot.
  uint64_t epoch() const { return epoch_.load(std::memory_order_relaxed); }
  void set_epoch(uint64_t epoch) { epoch_.store(epoch); }

  // Counts a finished wait (time out) and logs it.
  void NoteWaitEnd(const PullRequest& request, const absl::Status& status);

  const ServiceContext& context() const { return c_; }

 private:
  const ServiceContext c_;
  const absl::Time start_time_;
  std::atomic<uint64_t> epoch_;
  // Creations of INIT_VALUES tensors and assigns so far, and how many of
  // them the checkpoints written since hold.
  SlotLoadMeter slot_load_;  // per slot of a slotted map
  std::atomic<uint64_t> values_created_{0};
  std::atomic<uint64_t> values_saved_{0};
  absl::Mutex mu_;
  std::string address_ ABSL_GUARDED_BY(mu_);
  // The log entry the primary is running (RunStep): the rows evicted
  // meanwhile are added to it (TableStore::set_eviction_listener).
  absl::Mutex running_mu_;
  LogEntry* running_ ABSL_GUARDED_BY(running_mu_) = nullptr;
  uint64_t unlogged_evictions_ ABSL_GUARDED_BY(running_mu_) = 0;
  void NoteEviction(absl::string_view table, absl::Span<const uint64_t> ids,
                    bool idle);
  // The state digest being computed (Status with state_digest), if any.
  absl::Mutex digest_mu_;
  bool digesting_ ABSL_GUARDED_BY(digest_mu_) = false;
  std::thread digest_thread_ ABSL_GUARDED_BY(digest_mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_PS_SERVICE_H_
