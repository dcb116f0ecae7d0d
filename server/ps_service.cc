#include "server/ps_service.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
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

uint64_t PushBytes(const PushRequest& r) {
  uint64_t n = 0;
  for (const SliceGradient& g : r.grads()) n += g.grad().size();
  return n;
}

}  // namespace

PsService::PsService(ServiceIdentity identity, ShardStore* store,
                     WorkerTable* workers, ShardStats* stats,
                     StalenessRule rule, std::shared_ptr<spdlog::logger> logger)
    : identity_(std::move(identity)),
      store_(store),
      workers_(workers),
      stats_(stats),
      rule_(rule),
      logger_(std::move(logger)),
      start_time_(absl::Now()) {}

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
  // Validate before touching the worker table: a rejected pull must not
  // register the worker or move its clock (that could release other pulls).
  absl::Status s = store_->ValidatePull(*request);
  if (s.ok()) {
    s = workers_->Touch(request->worker(), request->worker().clock(),
                        /*push=*/false);
  }
  if (!s.ok()) {
    stats_->RecordBadInput();
    return Finish(ctx, s);
  }
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const absl::Time start = absl::Now();
  // The callback may run inline or later on another thread (a push or
  // heartbeat that lets the pull through, or the table's timer).
  const bool waited = workers_->WhenReady(
      request->worker().worker_id(), request->worker().clock(),
      [this, reactor, request, response, start](absl::Status status) {
        if (status.ok()) {
          status = store_->Pull(*request, response);
          response->set_waited_us(
              absl::ToInt64Microseconds(absl::Now() - start));
          stats_->RecordPull(PullBytes(*response));
        } else if (absl::IsDeadlineExceeded(status)) {
          stats_->RecordPullWaitTimeout();
          logger_->warn("pull by worker {} at clock {}: {}",
                        request->worker().worker_id(),
                        request->worker().clock(), std::string(status.message()));
        }
        reactor->Finish(ToGrpcStatus(status));
      });
  if (waited) stats_->RecordPullWait();
  return reactor;
}

grpc::ServerUnaryReactor* PsService::Push(grpc::CallbackServerContext* ctx,
                                          const PushRequest* request,
                                          PushResponse* response) {
  // Validate everything before anything changes: the worker ref, then every
  // slice. The clock is recorded only for a push that is applied.
  if (request->worker().worker_id() < 0 ||
      request->worker().incarnation() == 0 || request->worker().clock() < 0) {
    stats_->RecordBadInput();
    return Finish(ctx, absl::InvalidArgumentError(absl::StrCat(
                           "push needs worker_id >= 0, incarnation > 0 and "
                           "clock >= 0; got id ",
                           request->worker().worker_id(), ", incarnation ",
                           request->worker().incarnation(), ", clock ",
                           request->worker().clock())));
  }
  absl::StatusOr<std::vector<ShardStore::Slice*>> slices =
      store_->ValidatePush(*request);
  if (!slices.ok()) {
    stats_->RecordBadInput();
    logger_->debug("push from worker {} refused: {}",
                   request->worker().worker_id(), slices.status().ToString());
    return Finish(ctx, slices.status());
  }
  absl::StatusOr<bool> applied =
      dedup_.RunOnce(request->worker(), request->seq(), [&] {
        store_->ApplyPush(*request, *slices, rule_, response);
      });
  if (!applied.ok()) {
    stats_->RecordBadInput();
    return Finish(ctx, applied.status());
  }
  response->set_duplicate(!*applied);
  stats_->RecordPush(PushBytes(*request), !*applied);
  for (const SliceResult& r : response->results()) stats_->RecordSliceResult(r);
  // After this push the worker has completed clock + 1 steps.
  const absl::Status s = workers_->Touch(
      request->worker(), request->worker().clock() + 1, /*push=*/*applied);
  return Finish(ctx, s);
}

grpc::ServerUnaryReactor* PsService::Status(grpc::CallbackServerContext* ctx,
                                            const StatusRequest* /*request*/,
                                            StatusResponse* response) {
  FillStatus(response);
  return Finish(ctx, absl::OkStatus());
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
