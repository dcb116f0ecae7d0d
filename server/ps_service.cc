#include "server/ps_service.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/fast_frame.h"
#include "common/grpc_status.h"
#include "common/names.h"
#include "common/shard_map_proto.h"
#include "server/data_streams.h"
#include "server/pull_wait.h"
#include "server/push_transaction.h"

namespace asyncps {

namespace {

grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* ctx,
                                 const absl::Status& s) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

uint64_t PayloadBytes(absl::Span<const Payload> grads) {
  uint64_t n = 0;
  for (const Payload& g : grads) n += g.size();
  return n;
}

// The clock a pull's rows are marked used at (--row_ttl_steps).
int64_t RowsClock(const PullRequest& request) {
  return std::max(request.worker().clock(), request.for_clock());
}

// Who is pulling, before the tensors and rows are looked at: a worker's
// pull names a well-formed worker reference, a reader's (read_only) names no
// worker and no for_clock.
// Then the map it was routed with.
absl::Status CheckPullCaller(const PullRequest& request,
                             const ServiceContext& c) {
  if (!request.read_only()) {
    absl::Status s = CheckWorkerRef(request.worker());
    if (!s.ok()) return s;
  } else if (request.has_worker() || request.for_clock() != 0) {
    return absl::InvalidArgumentError(
        "a read_only pull names no worker and no for_clock: it reads what the "
        "shard holds and registers nobody");
  }
  return CheckServing(c, request.map_epoch());
}

// A refusal for the map a request was routed with (common/shard_map.h):
// not bad input, the client routes it again or retries.
bool IsRoutingRefusal(const absl::Status& s) {
  return absl::IsUnavailable(s) || RefusalMap(s).has_value();
}

// A reader's pull creates nothing: every TableIds is a peek.
absl::Status CheckReadOnlyRows(const PullRequest& request) {
  for (const TableIds& t : request.rows()) {
    if (!t.peek()) {
      return absl::InvalidArgumentError(
          absl::StrCat("a read_only pull creates no rows: set peek on table ",
                       QuoteName(t.table())));
    }
  }
  return absl::OkStatus();
}

// A unary Pull that may wait: cancellation reaches its wait.
class UnaryPullReactor : public grpc::ServerUnaryReactor {
 public:
  explicit UnaryPullReactor(std::shared_ptr<PullWait> wait)
      : wait_(std::move(wait)) {}
  void OnCancel() override { wait_->Cancel(); }
  void OnDone() override { delete this; }

 private:
  const std::shared_ptr<PullWait> wait_;
};

}  // namespace

PsService::~PsService() {
  std::thread digest;
  {
    absl::MutexLock l(&digest_mu_);
    digest = std::move(digest_thread_);
  }
  if (digest.joinable()) digest.join();
}

PsService::PsService(ServiceContext context)
    : c_(std::move(context)),
      start_time_(c_.clock->Now()),
      epoch_(c_.epoch),
      slot_load_(c_.store->map()) {
  if (c_.log != nullptr) {
    c_.store->tables().set_eviction_listener(
        [this](absl::string_view table, absl::Span<const uint64_t> ids,
               bool idle) { NoteEviction(table, ids, idle); });
  }
}

// Parses a unary request, runs handle(request, &response) and answers.
template <typename Request, typename Response, typename Handler>
grpc::ServerUnaryReactor* ServeUnary(ShardStats* stats,
                                     grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* in,
                                     grpc::ByteBuffer* out, Handler handle) {
  Request request;
  absl::Status s = ParseFromByteBuffer(*in, &request);
  if (!s.ok()) {
    stats->RecordBadInput();
    return Finish(ctx, s);
  }
  Response response;
  s = handle(request, &response);
  if (s.ok()) *out = SerializeToByteBuffer(response);
  return Finish(ctx, s);
}

// ServeUnary for a state-changing call: the caller must be at the primary,
// handle runs as one step of the shard (PsService::RunStep) and the answer
// waits for the backups. set_entry puts the request into a log entry.
template <typename Request, typename Response, typename Handler,
          typename SetEntry>
grpc::ServerUnaryReactor* ServeStep(PsService* service,
                                    grpc::CallbackServerContext* ctx,
                                    const grpc::ByteBuffer* in,
                                    grpc::ByteBuffer* out, Handler handle,
                                    SetEntry set_entry) {
  Request request;
  absl::Status s = ParseFromByteBuffer(*in, &request);
  if (!s.ok()) {
    service->context().stats->RecordBadInput();
    return Finish(ctx, s);
  }
  s = service->CheckPrimary();
  if (!s.ok()) return Finish(ctx, s);
  auto response = std::make_shared<Response>();
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  service->RunStep(
      [&] {
        LogEntry entry;
        *set_entry(&entry) = request;
        return entry;
      },
      [&] { return handle(request, response.get()); },
      [reactor, out, response](absl::Status st) {
        if (st.ok()) *out = SerializeToByteBuffer(*response);
        reactor->Finish(ToGrpcStatus(st));
      });
  return reactor;
}

absl::Status PsService::SyncSpecs(absl::string_view what) {
  // Also when the call changed nothing, so that a retry after a failed
  // write writes again.
  if (c_.specs == nullptr) return absl::OkStatus();
  absl::Status durable = c_.specs->Sync();
  if (durable.ok()) return durable;
  c_.logger->error("cannot write the spec file ({} on this shard): {}",
                   std::string(what), durable.ToString());
  return absl::Status(
      durable.code(),
      absl::StrCat(what,
                   " on this shard but could not be made durable (a restart "
                   "would lose them; retry once fixed): ",
                   durable.message()));
}

absl::StatusOr<CreateTensorResponse> PsService::DoCreate(
    const CreateTensorRequest& request, bool* needs_checkpoint) {
  absl::StatusOr<CreateTensorResponse> r = c_.store->CreateTensors(request);
  if (!r.ok()) {
    c_.stats->RecordBadInput();
    c_.logger->debug("CreateTensor refused: {}", r.status().ToString());
    return r.status();
  }
  if (r->created() > 0) {
    c_.logger->info("created {} tensor(s)", r->created());
  }
  // Durable before the answer: a shard restarted from now on has these
  // tensors (server/spec_file.h).
  absl::Status durable = SyncSpecs("the tensors exist");
  if (!durable.ok()) return durable;
  // Values given at creation are not in the spec file: a checkpoint holds
  // them before the answer (and again on a retry until one has).
  bool values = false;
  for (const TensorSpec& t : request.tensors()) {
    values = values || t.init() == INIT_VALUES;
  }
  if (values && r->created() > 0) values_created_.fetch_add(1);
  *needs_checkpoint = values && c_.checkpointer != nullptr &&
                      values_saved_.load() < values_created_.load();
  return r;
}

void PsService::WhenValuesDurable(absl::string_view what,
                                  std::function<void(absl::Status)> done) {
  const uint64_t generation = values_created_.load();
  c_.checkpointer->Request(
      [this, what = std::string(what), generation,
       done = std::move(done)](const absl::StatusOr<CheckpointInfo>& info) {
        if (!info.ok()) {
          c_.logger->error("cannot make given values durable ({}): {}", what,
                           info.status().ToString());
          done(absl::Status(
              info.status().code(),
              absl::StrCat(what,
                           " on this shard but could not be checkpointed (a "
                           "restart would lose it; retry once fixed): ",
                           info.status().message())));
          return;
        }
        uint64_t saved = values_saved_.load();
        while (saved < generation &&
               !values_saved_.compare_exchange_weak(saved, generation)) {
        }
        done(absl::OkStatus());
      });
}

grpc::ServerUnaryReactor* PsService::CreateTensor(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
    grpc::ByteBuffer* out) {
  auto request = std::make_shared<CreateTensorRequest>();
  absl::Status s = ParseFromByteBuffer(*in, request.get());
  if (!s.ok()) {
    c_.stats->RecordBadInput();
    return Finish(ctx, s);
  }
  s = CheckPrimary();
  if (!s.ok()) return Finish(ctx, s);
  auto response = std::make_shared<CreateTensorResponse>();
  auto needs_checkpoint = std::make_shared<bool>(false);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto finish = [reactor, out, response](absl::Status st) {
    if (st.ok()) *out = SerializeToByteBuffer(*response);
    reactor->Finish(ToGrpcStatus(st));
  };
  RunStep(
      [&] {
        LogEntry entry;
        *entry.mutable_create() = *request;
        return entry;
      },
      [&] {
        absl::StatusOr<CreateTensorResponse> r =
            DoCreate(*request, needs_checkpoint.get());
        if (r.ok()) {
          *response = *std::move(r);
          ShardMapToProto(ShownMap(), response->mutable_map());
        }
        return r.status();
      },
      [this, finish, needs_checkpoint](absl::Status st) {
        if (!st.ok() || !*needs_checkpoint) return finish(st);
        WhenValuesDurable("the tensors exist with their values", finish);
      });
  return reactor;
}

grpc::ServerUnaryReactor* PsService::ListTensors(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
    grpc::ByteBuffer* out) {
  return ServeUnary<ListTensorsRequest, ListTensorsResponse>(
      c_.stats, ctx, in, out,
      [this](const ListTensorsRequest&, ListTensorsResponse* response) {
        for (TensorSpec& spec : c_.store->ListTensors()) {
          *response->add_tensors() = std::move(spec);
        }
        for (TableSpec& spec : c_.store->tables().List()) {
          *response->add_tables() = std::move(spec);
        }
        response->set_run_id(c_.run_id);
        ShardMapToProto(ShownMap(), response->mutable_map());
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* PsService::SetLearningRate(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
    grpc::ByteBuffer* out) {
  return ServeStep<SetLearningRateRequest, SetLearningRateResponse>(
      this, ctx, in, out,
      [this](const SetLearningRateRequest& request,
             SetLearningRateResponse* response) {
        return DoSetLearningRate(request, response);
      },
      [](LogEntry* e) { return e->mutable_rates(); });
}

absl::Status PsService::DoSetLearningRate(const SetLearningRateRequest& request,
                                          SetLearningRateResponse* response) {
  bool changed = false;
  absl::StatusOr<SetLearningRateResponse> r =
      c_.store->SetLearningRates(request, &changed);
  if (!r.ok()) {
    c_.stats->RecordBadInput();
    return r.status();
  }
  if (changed) {
    for (const LearningRate& rate : r->rates()) {
      c_.logger->info("learning rate of {} is {} from schedule step {}",
                      QuoteName(rate.name()), rate.learning_rate(),
                      rate.step());
    }
  }
  absl::Status durable = SyncSpecs("the learning rates apply");
  if (!durable.ok()) return durable;
  *response = *std::move(r);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* PsService::Heartbeat(grpc::CallbackServerContext* ctx,
                                               const grpc::ByteBuffer* in,
                                               grpc::ByteBuffer* out) {
  return ServeStep<HeartbeatRequest, HeartbeatResponse>(
      this, ctx, in, out,
      [this](const HeartbeatRequest& request, HeartbeatResponse* response) {
        return DoHeartbeat(request, response);
      },
      [](LogEntry* e) { return e->mutable_heartbeat(); });
}

absl::Status PsService::DoHeartbeat(const HeartbeatRequest& request,
                                    HeartbeatResponse* response) {
  response->set_run_id(c_.run_id);
  if (request.run_id() != c_.run_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", c_.shard_index, " belongs to run '", c_.run_id,
                     "' and worker ", request.worker().worker_id(), " to run '",
                     request.run_id(),
                     "': start shards and workers with the same --run_id"));
  }
  if (request.leaving()) {
    const absl::Status s = c_.workers->Leave(request.worker());
    if (absl::IsInvalidArgument(s)) c_.stats->RecordBadInput();
    if (!s.ok()) return s;
  } else {
    absl::StatusOr<WorkerRegistry::Admission> a =
        c_.workers->Admit(request.worker());
    if (absl::IsInvalidArgument(a.status())) c_.stats->RecordBadInput();
    if (!a.ok()) return a.status();
    response->set_resume_clock(a->clock);
    response->set_previous_clock(a->previous_clock);
    response->set_trained(a->trained);
  }
  int live = 0;
  for (const WorkerInfo& w : c_.workers->Workers()) live += w.live;
  const int64_t min_clock = c_.workers->MinLiveClock();
  response->set_min_clock(
      min_clock == std::numeric_limits<int64_t>::max() ? 0 : min_clock);
  response->set_live_workers(live);
  response->set_shard_epoch(epoch());
  return absl::OkStatus();
}

absl::Status PsService::BeginPull(const PullRequest& request, int64_t* target) {
  absl::Status s = CheckPull(request);
  if (!s.ok()) return s;
  if (request.read_only()) {
    s = CheckReadOnlyRows(request);
    if (!s.ok()) c_.stats->RecordBadInput();
    *target = 0;
    return s;
  }
  absl::StatusOr<WorkerRegistry::Admission> a =
      c_.workers->Admit(request.worker());
  if (!a.ok()) {
    if (absl::IsInvalidArgument(a.status())) c_.stats->RecordBadInput();
    return a.status();
  }
  *target = std::max(a->clock, request.for_clock());
  return absl::OkStatus();
}

absl::Status PsService::CheckPull(const PullRequest& request) {
  absl::Status s = CheckPullCaller(request, c_);
  if (s.ok() && request.wire_dtype() != WIRE_F32 &&
      request.wire_dtype() != WIRE_BF16) {
    s = absl::InvalidArgumentError(
        absl::StrCat("unknown wire_dtype ", request.wire_dtype()));
  }
  if (!s.ok()) {
    if (!IsRoutingRefusal(s)) c_.stats->RecordBadInput();
    return s;
  }
  // Validate before touching the registry: a rejected pull must not
  // register the worker or move its clock (that could release other pulls).
  s = c_.store->ValidatePull(request);
  if (s.ok()) s = c_.store->tables().ValidatePull(request);
  if (!s.ok()) c_.stats->RecordBadInput();
  return s;
}

WorkerRegistry::WaitId PsService::WhenReady(const PullRequest& request,
                                            int64_t target,
                                            WorkerRegistry::Callback done) {
  if (request.read_only()) {
    done(absl::OkStatus());
    return 0;
  }
  return c_.workers->WhenReady(request.worker().worker_id(), target,
                               std::move(done));
}

void PsService::NoteWaitEnd(const PullRequest& request,
                            const absl::Status& status) {
  if (absl::IsDeadlineExceeded(status)) {
    c_.stats->RecordPullWaitTimeout();
    c_.logger->warn("pull by worker {} at clock {}: {}",
                    request.worker().worker_id(), request.worker().clock(),
                    std::string(status.message()));
  }
}

absl::Status PsService::CopyPull(const PullRequest& request,
                                 PullResponse* response) {
  // Checked again where it is read: the map may have changed while the
  // pull waited (no change while the pass is held).
  PushGate::Pass pass(c_.gate, request.worker().worker_id());
  absl::Status s = CheckServing(c_, request.map_epoch());
  if (s.ok()) s = c_.store->Pull(request, response);
  if (s.ok()) {
    s = c_.store->tables().Pull(
        request, RowsClock(request), WIRE_F32, response,
        [response](int k, size_t n) {
          std::string* values = response->mutable_rows(k)->mutable_values();
          values->resize(n);
          return &(*values)[0];
        });
  }
  if (!s.ok()) return s;
  uint64_t bytes = 0;
  for (const SliceData& d : response->slices()) bytes += d.values().size();
  for (RowsData& d : *response->mutable_rows()) {
    bytes += d.values().size();
    d.clear_payload_bytes();
  }
  response->set_shard_epoch(epoch());
  c_.stats->RecordPull(bytes);
  return absl::OkStatus();
}

absl::StatusOr<grpc::ByteBuffer> PsService::CopyPullFrame(
    const PullRequest& request, PullResponse* header) {
  const WireDtype dtype = request.wire_dtype();
  std::vector<grpc::Slice> payload;
  uint64_t bytes = 0;
  // As CopyPull.
  PushGate::Pass pass(c_.gate, request.worker().worker_id());
  if (absl::Status routed = CheckServing(c_, request.map_epoch());
      !routed.ok()) {
    return routed;
  }
  const absl::Status s = c_.store->Pull(
      request, [&](const std::string& tensor, uint32_t slice, uint64_t version,
                   absl::Span<const float> values) {
        const size_t n = values.size() * WireBytes(dtype);
        SliceData* d = header->add_slices();
        d->set_tensor(tensor);
        d->set_slice(slice);
        d->set_version(version);
        d->set_payload_bytes(n);
        // The one copy: from the slice, under its lock, into the buffer
        // that is sent.
        grpc::Slice out(n);
        char* dst = reinterpret_cast<char*>(const_cast<uint8_t*>(out.begin()));
        if (dtype == WIRE_BF16) {
          EncodeBf16(values.data(), values.size(), dst);
        } else {
          std::memcpy(dst, values.data(), n);
        }
        payload.push_back(std::move(out));
        bytes += n;
      });
  if (!s.ok()) return s;
  // Sparse rows after the slices: copied once, into the buffers sent.
  const absl::Status rows = c_.store->tables().Pull(
      request, RowsClock(request), dtype, header, [&](int, size_t n) {
        payload.emplace_back(n);
        bytes += n;
        return reinterpret_cast<char*>(
            const_cast<uint8_t*>(payload.back().begin()));
      });
  if (!rows.ok()) return rows;
  header->set_shard_epoch(epoch());
  header->set_wire_dtype(dtype);
  c_.stats->RecordPull(bytes);
  return MakeFrame(*header, payload);
}

grpc::ServerUnaryReactor* PsService::Pull(grpc::CallbackServerContext* ctx,
                                          const grpc::ByteBuffer* in,
                                          grpc::ByteBuffer* out) {
  auto request = std::make_shared<PullRequest>();
  absl::Status s = ParseFromByteBuffer(*in, request.get());
  if (s.ok()) s = CheckPullCaller(*request, c_);
  if (s.ok() && request->wire_dtype() != WIRE_F32) {
    s = absl::InvalidArgumentError(
        "Pull answers float32; wire_dtype is for PullStream");
  }
  if (!s.ok()) {
    if (!IsRoutingRefusal(s)) c_.stats->RecordBadInput();
    return Finish(ctx, s);
  }
  if (!request->read_only()) s = CheckPrimary();
  if (!s.ok()) return Finish(ctx, s);
  int64_t target = 0;
  s = BeginPull(*request, &target);
  if (!s.ok()) return Finish(ctx, s);
  auto wait = std::make_shared<PullWait>(c_.workers);
  auto* reactor = new UnaryPullReactor(wait);
  const absl::Time start = c_.clock->Now();
  // The callback may run inline or later on another thread (a push or
  // heartbeat that lets the pull through, the timer, or a cancellation).
  const WorkerRegistry::WaitId id = WhenReady(
      *request, target,
      [this, reactor, request, wait, start, out](absl::Status status) {
        wait->Ended();
        NoteWaitEnd(*request, status);
        if (!status.ok()) return reactor->Finish(ToGrpcStatus(status));
        auto response = std::make_shared<PullResponse>();
        RunPullStep(
            *request, [&] { return CopyPull(*request, response.get()); },
            [this, reactor, response, start, out](absl::Status st) {
              response->set_waited_us(
                  absl::ToInt64Microseconds(c_.clock->Now() - start));
              if (st.ok()) *out = SerializeToByteBuffer(*response);
              reactor->Finish(ToGrpcStatus(st));
            });
      });
  if (id != 0) c_.stats->RecordPullWait();
  wait->Started(id);
  return reactor;
}

absl::Status PsService::DoPush(const PushRequest& request,
                               absl::Span<const Payload> grads,
                               PushResponse* response,
                               absl::Span<const Payload> rows,
                               bool* needs_checkpoint) {
  *needs_checkpoint = false;
  PushTransaction push(c_, request);
  absl::Status s = push.Prepare(grads, rows);
  if (!s.ok()) return s;
  const uint64_t bytes = PayloadBytes(grads) + PayloadBytes(rows);
  if (push.duplicate()) {
    response->set_duplicate(true);
  } else {
    push.Commit(response);
    slot_load_.Record(request, grads, rows);
    if (request.assign()) values_created_.fetch_add(1);
  }
  c_.stats->RecordPush(bytes, push.duplicate(), *response);
  // Assigned values are kept by checkpoints only: durable before the
  // answer (and again for a retry until a checkpoint holds them), so that
  // a shard restarted later never goes back to the values before an
  // acknowledged assign.
  *needs_checkpoint = request.assign() && c_.checkpointer != nullptr &&
                      values_saved_.load() < values_created_.load();
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* PsService::Push(grpc::CallbackServerContext* ctx,
                                          const grpc::ByteBuffer* in,
                                          grpc::ByteBuffer* out) {
  PushRequest request;
  absl::Status s = ParseFromByteBuffer(*in, &request);
  if (s.ok()) s = PushTransaction::CheckCaller(request);
  if (s.ok() && request.wire_dtype() != WIRE_F32) {
    s = absl::InvalidArgumentError(
        "Push carries float32; wire_dtype is for PushStream");
  }
  if (!s.ok()) {
    c_.stats->RecordBadInput();
    return Finish(ctx, s);
  }
  s = CheckPrimary();
  if (!s.ok()) return Finish(ctx, s);
  auto response = std::make_shared<PushResponse>();
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  RunPushStep(request, ShardStore::PayloadsOf(request),
              TableStore::PayloadsOf(request), /*frames=*/nullptr,
              response.get(), [reactor, out, response](absl::Status st) {
                if (st.ok()) *out = SerializeToByteBuffer(*response);
                reactor->Finish(ToGrpcStatus(st));
              });
  return reactor;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
PsService::PullStream(grpc::CallbackServerContext* /*ctx*/) {
  return NewPullStreamReactor(this);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
PsService::PushStream(grpc::CallbackServerContext* /*ctx*/) {
  return NewPushStreamReactor(this);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
PsService::StepStream(grpc::CallbackServerContext* /*ctx*/) {
  return NewStepStreamReactor(this);
}

grpc::ServerUnaryReactor* PsService::Status(grpc::CallbackServerContext* ctx,
                                            const grpc::ByteBuffer* in,
                                            grpc::ByteBuffer* out) {
  StatusRequest request;
  absl::Status s = ParseFromByteBuffer(*in, &request);
  if (!s.ok()) {
    c_.stats->RecordBadInput();
    return Finish(ctx, s);
  }
  if (!request.state_digest() || !c_.state_digest) {
    StatusResponse response;
    FillStatus(&response);
    if (request.slot_load()) slot_load_.Fill(&response);
    *out = SerializeToByteBuffer(response);
    return Finish(ctx, absl::OkStatus());
  }
  // The digest reads the whole state: not on one of gRPC's threads, and one
  // at a time (a burst of such requests costs one capture, not one each).
  absl::MutexLock l(&digest_mu_);
  if (digesting_) {
    return Finish(
        ctx, absl::UnavailableError("a state digest is being computed; retry"));
  }
  if (digest_thread_.joinable()) digest_thread_.join();  // it has finished
  digesting_ = true;
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  digest_thread_ = std::thread([this, reactor, out] {
    StatusResponse response;
    FillStatus(&response);
    c_.state_digest(&response);
    *out = SerializeToByteBuffer(response);
    {
      absl::MutexLock l(&digest_mu_);
      digesting_ = false;
    }
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* PsService::Checkpoint(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
    grpc::ByteBuffer* out) {
  CheckpointRequest request;
  absl::Status s = ParseFromByteBuffer(*in, &request);
  if (!s.ok()) {
    c_.stats->RecordBadInput();
    return Finish(ctx, s);
  }
  if (c_.checkpointer == nullptr) {
    return Finish(ctx, absl::FailedPreconditionError(
                           "checkpoints are off on this shard (start "
                           "ps_server with --checkpoint_dir)"));
  }
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  c_.checkpointer->Request(
      [reactor, out](const absl::StatusOr<CheckpointInfo>& info) {
        if (info.ok()) {
          CheckpointResponse response;
          *response.mutable_checkpoint() = *info;
          *out = SerializeToByteBuffer(response);
        }
        reactor->Finish(ToGrpcStatus(info.status()));
      });
  return reactor;
}

void PsService::FillStatus(StatusResponse* r) {
  r->set_shard_index(c_.shard_index);
  r->set_num_shards(c_.num_shards);
  {
    absl::MutexLock l(&mu_);
    r->set_address(address_);
  }
  r->set_build_version(c_.build_version);
  ShardMapToProto(ShownMap(), r->mutable_map());
  if (c_.replica_status) c_.replica_status(r);
  if (c_.slot_move) r->set_slot_move(c_.slot_move());
  if (c_.drained) r->set_drained(c_.drained());
  const absl::Time now = c_.clock->Now();
  r->set_uptime_ms(absl::ToInt64Milliseconds(now - start_time_));
  *r->mutable_policy() = c_.policy;
  const StoreSize size = c_.store->Size();
  r->set_tensors(size.tensors);
  r->set_slices(size.slices);
  r->set_parameter_bytes(size.parameter_bytes);
  r->set_max_parameter_bytes(c_.max_parameter_bytes);
  r->set_reserved_parameter_bytes(size.reserved_bytes);
  r->set_slices_remade(size.slices_remade);
  for (TableStatus& t : c_.store->tables().Status()) {
    *r->add_tables() = std::move(t);
  }
  r->set_shard_epoch(epoch());
  r->set_run_id(c_.run_id);
  for (LearningRate& rate : c_.store->LearningRates()) {
    *r->add_learning_rates() = std::move(rate);
  }
  c_.stats->Snapshot(r->mutable_counters(), r->mutable_staleness(),
                     r->mutable_rates());
  const RegistryCounters rc = c_.workers->counters();
  Counters* counters = r->mutable_counters();
  counters->set_evictions(rc.evictions);
  counters->set_fenced_calls(rc.fenced_calls);
  counters->set_worker_restarts(rc.restarts);
  counters->set_cancelled_pulls(rc.cancelled_pulls);
  if (c_.checkpointer != nullptr) {
    counters->set_checkpoints_written(c_.checkpointer->written());
    counters->set_checkpoints_failed(c_.checkpointer->failed());
    CheckpointInfo last = c_.checkpointer->last();
    if (!last.path().empty()) *r->mutable_last_checkpoint() = std::move(last);
    r->set_checkpoint_error(c_.checkpointer->last_error());
  }
  if (!c_.restored_from.path().empty()) {
    *r->mutable_restored_from() = c_.restored_from;
  }

  const std::vector<WorkerInfo> workers = c_.workers->Workers();
  int64_t max_clock = 0, min_clock = std::numeric_limits<int64_t>::max();
  for (const WorkerInfo& w : workers) {
    if (!w.live) continue;
    max_clock = std::max(max_clock, w.clock);
    min_clock = std::min(min_clock, w.clock);
  }
  r->set_min_clock(
      min_clock == std::numeric_limits<int64_t>::max() ? 0 : min_clock);
  r->set_max_clock(max_clock);
  for (const WorkerInfo& w : workers) {
    WorkerStatus* ws = r->add_workers();
    ws->set_worker_id(w.worker_id);
    ws->set_incarnation(w.incarnation);
    ws->set_clock(w.clock);
    ws->set_lag(w.live ? max_clock - w.clock : 0);
    ws->set_last_heartbeat_age_ms(absl::ToInt64Milliseconds(w.silent_for));
    ws->set_pushes(w.pushes);
    ws->set_live(w.live);
    ws->set_left(w.left);
    ws->set_restarts(w.restarts);
    ws->set_waiting_pulls(w.waiting_pulls);
    ws->set_trained(w.trained);
  }
}

}  // namespace asyncps
