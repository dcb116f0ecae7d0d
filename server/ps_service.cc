#include "server/ps_service.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/fast_frame.h"
#include "common/grpc_status.h"

namespace asyncps {

namespace {

grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* ctx,
                                 const absl::Status& s) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

uint64_t PullBytes(const PullResponse& r) {
  uint64_t n = 0;
  for (const SliceData& s : r.slices()) n += s.values().size();
  return n;
}

uint64_t PayloadBytes(absl::Span<const FloatPayload> grads) {
  uint64_t n = 0;
  for (const FloatPayload& g : grads) n += g.size();
  return n;
}

// The gradients of a PushFast frame, after its header: grads[i] gets
// request.grads(i).grad_bytes() bytes; nothing may be left over.
absl::Status ReadFrameGradients(const PushRequest& request, FrameReader* reader,
                                std::vector<FloatPayload>* grads) {
  grads->resize(request.grads_size());
  for (int i = 0; i < request.grads_size(); ++i) {
    const SliceGradient& g = request.grads(i);
    absl::Status s =
        g.grad().empty()
            ? reader->Next(g.grad_bytes(), &(*grads)[i])
            : absl::InvalidArgumentError(
                  "PushFast carries gradients after the header, not in "
                  "SliceGradient.grad");
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("slice ", g.slice(), " of tensor '", g.tensor(),
                       "' (grad_bytes ", g.grad_bytes(), "): ", s.message()));
    }
  }
  if (reader->remaining() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "frame: ", reader->remaining(),
        " payload bytes beyond the gradients' grad_bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

PsService::PsService(ServiceIdentity identity, ShardStore* store,
                     WorkerTable* workers, ShardStats* stats,
                     StalenessRule rule, std::shared_ptr<spdlog::logger> logger,
                     Checkpointer* checkpointer, CheckpointInfo restored_from)
    : identity_(std::move(identity)),
      store_(store),
      workers_(workers),
      stats_(stats),
      rule_(rule),
      logger_(std::move(logger)),
      start_time_(absl::Now()),
      checkpointer_(checkpointer),
      restored_from_(std::move(restored_from)) {}

grpc::ServerUnaryReactor* PsService::CreateTensor(
    grpc::CallbackServerContext* ctx, const CreateTensorRequest* request,
    CreateTensorResponse* response) {
  absl::StatusOr<CreateTensorResponse> r = store_->CreateTensors(*request);
  if (!r.ok()) {
    stats_->RecordBadInput();
    logger_->debug("CreateTensor refused: {}", r.status().ToString());
    return Finish(ctx, r.status());
  }
  *response = *std::move(r);
  if (response->created() > 0) {
    for (const TensorSpec& spec : response->tensors()) {
      logger_->debug("tensor '{}' ready ({} elems per slice)", spec.name(),
                     spec.slice_elems());
    }
    logger_->info("created {} tensor(s)", response->created());
  }
  return Finish(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* PsService::ListTensors(
    grpc::CallbackServerContext* ctx, const ListTensorsRequest* /*request*/,
    ListTensorsResponse* response) {
  for (TensorSpec& spec : store_->ListTensors()) {
    *response->add_tensors() = std::move(spec);
  }
  return Finish(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* PsService::Heartbeat(grpc::CallbackServerContext* ctx,
                                               const HeartbeatRequest* request,
                                               HeartbeatResponse* response) {
  const absl::Status s =
      request->leaving()
          ? workers_->Leave(request->worker())
          : workers_->Touch(request->worker(), request->worker().clock(),
                            /*push=*/false);
  if (!s.ok()) {
    stats_->RecordBadInput();
    return Finish(ctx, s);
  }
  int live = 0;
  for (const WorkerInfo& w : workers_->Workers()) live += w.live ? 1 : 0;
  const int64_t min_clock = workers_->MinLiveClock();
  response->set_min_clock(
      min_clock == std::numeric_limits<int64_t>::max() ? 0 : min_clock);
  response->set_live_workers(live);
  return Finish(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* PsService::Pull(grpc::CallbackServerContext* ctx,
                                          const PullRequest* request,
                                          PullResponse* response) {
  return StartPull(
      ctx, *request,
      [this, request, response](int64_t waited_us) -> absl::StatusOr<uint64_t> {
        const absl::Status s = store_->Pull(*request, response);
        response->set_waited_us(waited_us);
        if (!s.ok()) return s;
        return PullBytes(*response);
      });
}

grpc::ServerUnaryReactor* PsService::PullFast(grpc::CallbackServerContext* ctx,
                                              const grpc::ByteBuffer* request,
                                              grpc::ByteBuffer* response) {
  auto parsed = std::make_shared<PullRequest>();
  const absl::Status s = ParseFromByteBuffer(*request, parsed.get());
  if (!s.ok()) {
    stats_->RecordBadInput();
    return Finish(ctx, s);
  }
  return StartPull(
      ctx, *parsed,
      [this, parsed, response](int64_t waited_us) -> absl::StatusOr<uint64_t> {
        PullResponse header;
        std::vector<grpc::Slice> payload;
        uint64_t bytes = 0;
        const absl::Status s = store_->Pull(
            *parsed, [&](const std::string& tensor, uint32_t slice,
                         uint64_t version, absl::Span<const float> values) {
              const size_t n = values.size() * sizeof(float);
              SliceData* d = header.add_slices();
              d->set_tensor(tensor);
              d->set_slice(slice);
              d->set_version(version);
              d->set_payload_bytes(n);
              // The one copy: from the slice, under its lock, into the
              // buffer that is sent.
              grpc::Slice out(n);
              std::memcpy(const_cast<uint8_t*>(out.begin()), values.data(), n);
              payload.push_back(std::move(out));
              bytes += n;
            });
        if (!s.ok()) return s;
        header.set_waited_us(waited_us);
        *response = MakeFrame(header, payload);
        return bytes;
      });
}

grpc::ServerUnaryReactor* PsService::StartPull(grpc::CallbackServerContext* ctx,
                                               const PullRequest& request,
                                               PullCopy copy_out) {
  // Validate before touching the worker table: a rejected pull must not
  // register the worker or move its clock (that could release other pulls).
  absl::Status s = store_->ValidatePull(request);
  if (s.ok()) {
    s = workers_->Touch(request.worker(), request.worker().clock(),
                        /*push=*/false);
  }
  if (!s.ok()) {
    stats_->RecordBadInput();
    return Finish(ctx, s);
  }
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const absl::Time start = absl::Now();
  const int32_t worker_id = request.worker().worker_id();
  const int64_t clock = request.worker().clock();
  // The callback may run inline or later on another thread (a push or
  // heartbeat that lets the pull through, or the table's timer).
  const bool waited = workers_->WhenReady(
      worker_id, clock,
      [this, reactor, copy_out = std::move(copy_out), start, worker_id,
       clock](absl::Status status) {
        if (status.ok()) {
          absl::StatusOr<uint64_t> bytes =
              copy_out(absl::ToInt64Microseconds(absl::Now() - start));
          status = bytes.status();
          if (bytes.ok()) stats_->RecordPull(*bytes);
        } else if (absl::IsDeadlineExceeded(status)) {
          stats_->RecordPullWaitTimeout();
          logger_->warn("pull by worker {} at clock {}: {}", worker_id, clock,
                        std::string(status.message()));
        }
        reactor->Finish(ToGrpcStatus(status));
      });
  if (waited) stats_->RecordPullWait();
  return reactor;
}

grpc::ServerUnaryReactor* PsService::Push(grpc::CallbackServerContext* ctx,
                                          const PushRequest* request,
                                          PushResponse* response) {
  return Finish(ctx,
                DoPush(*request, ShardStore::PayloadsOf(*request), response));
}

grpc::ServerUnaryReactor* PsService::PushFast(grpc::CallbackServerContext* ctx,
                                              const grpc::ByteBuffer* request,
                                              grpc::ByteBuffer* response) {
  // The gradients stay in gRPC's receive buffers; the reader holds them.
  PushRequest header;
  FrameReader reader;
  std::vector<FloatPayload> grads;
  absl::Status s = reader.Open(*request, &header);
  if (s.ok()) s = ReadFrameGradients(header, &reader, &grads);
  if (!s.ok()) {
    stats_->RecordBadInput();
    logger_->debug("fast push refused: {}", s.ToString());
    return Finish(ctx, s);
  }
  PushResponse answer;
  s = DoPush(header, grads, &answer);
  if (s.ok()) *response = SerializeToByteBuffer(answer);
  return Finish(ctx, s);
}

absl::Status PsService::DoPush(const PushRequest& request,
                               absl::Span<const FloatPayload> grads,
                               PushResponse* response) {
  // Validate everything before anything changes: the worker ref, then every
  // slice. The clock is recorded only for a push that is applied.
  if (request.worker().worker_id() < 0 ||
      request.worker().incarnation() == 0 || request.worker().clock() < 0) {
    stats_->RecordBadInput();
    return absl::InvalidArgumentError(absl::StrCat(
        "push needs worker_id >= 0, incarnation > 0 and clock >= 0; got id ",
        request.worker().worker_id(), ", incarnation ",
        request.worker().incarnation(), ", clock ", request.worker().clock()));
  }
  absl::StatusOr<std::vector<ShardStore::Slice*>> slices =
      store_->ValidatePush(request, grads);
  if (!slices.ok()) {
    stats_->RecordBadInput();
    logger_->debug("push from worker {} refused: {}",
                   request.worker().worker_id(), slices.status().ToString());
    return slices.status();
  }
  absl::StatusOr<bool> applied =
      dedup_.RunOnce(request.worker(), request.seq(), [&] {
        store_->ApplyPush(request, grads, *slices, rule_, response);
      });
  if (!applied.ok()) {
    stats_->RecordBadInput();
    return applied.status();
  }
  response->set_duplicate(!*applied);
  stats_->RecordPush(PayloadBytes(grads), !*applied);
  for (const SliceResult& r : response->results()) stats_->RecordSliceResult(r);
  // After this push the worker has completed clock + 1 steps.
  return workers_->Touch(request.worker(), request.worker().clock() + 1,
                         /*push=*/*applied);
}

grpc::ServerUnaryReactor* PsService::Status(grpc::CallbackServerContext* ctx,
                                            const StatusRequest* /*request*/,
                                            StatusResponse* response) {
  FillStatus(response);
  return Finish(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* PsService::Checkpoint(
    grpc::CallbackServerContext* ctx, const CheckpointRequest* /*request*/,
    CheckpointResponse* response) {
  if (checkpointer_ == nullptr) {
    return Finish(ctx, absl::FailedPreconditionError(
                           "checkpoints are off on this shard (start "
                           "ps_server with --checkpoint_dir)"));
  }
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  checkpointer_->Request(
      [reactor, response](const absl::StatusOr<CheckpointInfo>& info) {
        if (info.ok()) *response->mutable_checkpoint() = *info;
        reactor->Finish(ToGrpcStatus(info.status()));
      });
  return reactor;
}

void PsService::FillStatus(StatusResponse* r) {
  r->set_shard_index(identity_.shard_index);
  r->set_num_shards(identity_.num_shards);
  {
    absl::MutexLock l(&mu_);
    r->set_address(address_);
  }
  r->set_build_version(identity_.build_version);
  r->set_uptime_ms(absl::ToInt64Milliseconds(absl::Now() - start_time_));
  *r->mutable_policy() = identity_.policy;
  const StoreSize size = store_->Size();
  r->set_tensors(size.tensors);
  r->set_slices(size.slices);
  r->set_parameter_bytes(size.parameter_bytes);
  stats_->Snapshot(r->mutable_counters(), r->mutable_staleness(),
                   r->mutable_rates());
  r->mutable_counters()->set_evictions(workers_->evictions());
  if (checkpointer_ != nullptr) {
    r->mutable_counters()->set_checkpoints_written(checkpointer_->written());
    r->mutable_counters()->set_checkpoints_failed(checkpointer_->failed());
    CheckpointInfo last = checkpointer_->last();
    if (!last.path().empty()) *r->mutable_last_checkpoint() = std::move(last);
  }
  if (!restored_from_.path().empty()) {
    *r->mutable_restored_from() = restored_from_;
  }

  const std::vector<WorkerInfo> workers = workers_->Workers();
  int64_t max_clock = 0;
  for (const WorkerInfo& w : workers) {
    if (w.live) max_clock = std::max(max_clock, w.clock);
  }
  const int64_t min_clock = workers_->MinLiveClock();
  r->set_min_clock(min_clock == std::numeric_limits<int64_t>::max() ? 0
                                                                    : min_clock);
  r->set_max_clock(max_clock);
  const absl::Time now = workers_->options().now();
  for (const WorkerInfo& w : workers) {
    WorkerStatus* ws = r->add_workers();
    ws->set_worker_id(w.worker_id);
    ws->set_incarnation(w.incarnation);
    ws->set_clock(w.clock);
    ws->set_lag(w.live ? max_clock - w.clock : 0);
    ws->set_last_heartbeat_age_ms(absl::ToInt64Milliseconds(now - w.last_seen));
    ws->set_pushes(w.pushes);
    ws->set_live(w.live);
    ws->set_left(w.left);
  }
}

}  // namespace asyncps
