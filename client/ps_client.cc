#include "client/ps_client.h"

#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "client/data_stream.h"
#include "client/ps_client_internal.h"
#include "common/connection_check.h"
#include "common/fast_frame.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/names.h"
#include "common/net.h"
#include "common/payload.h"
#include "common/shard_map_proto.h"
#include "proto/slot_moves.grpc.pb.h"

namespace asyncps {

namespace {

constexpr absl::Duration kMaxPollInterval = absl::Seconds(1);
constexpr absl::Duration kShardWaitReport = absl::Seconds(5);
constexpr int kShardsProbedPerRound = 4;

// Prepares one Heartbeat attempt (for ToAllShards).
std::unique_ptr<grpc::ClientAsyncResponseReader<HeartbeatResponse>>
PrepareHeartbeat(ParameterServer::Stub* stub, grpc::ClientContext* ctx,
                 const HeartbeatRequest& request, grpc::CompletionQueue* cq) {
  return stub->PrepareAsyncHeartbeat(ctx, request, cq);
}

absl::StatusOr<uint64_t> PullAnswerId(const grpc::ByteBuffer& answer) {
  PullResponse header;
  FrameReader reader;
  absl::Status s = reader.Open(answer, &header);
  if (!s.ok()) return s;
  return header.request_id();
}

absl::StatusOr<uint64_t> PushAnswerId(const grpc::ByteBuffer& answer) {
  PushResponse response;
  absl::Status s = ParseFromByteBuffer(answer, &response);
  if (!s.ok()) return s;
  return response.request_id();
}

}  // namespace

// ---------------------------------------------------------------- set-up

struct PsClient::MapAsks {
  absl::Mutex mu;
  bool alive ABSL_GUARDED_BY(mu) = true;  // false once the client goes
  bool in_flight ABSL_GUARDED_BY(mu) = false;
  absl::Time last ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  size_t next ABSL_GUARDED_BY(mu) = 0;  // round robin over the shards
  // HandMapIfBehind: one hand-out at a time, the last per shard, the last
  // failure logged as a warning.
  bool handing ABSL_GUARDED_BY(mu) = false;
  absl::flat_hash_map<int, absl::Time> handed ABSL_GUARDED_BY(mu);
  absl::Time warned ABSL_GUARDED_BY(mu) = absl::InfinitePast();
};

PsClient::PsClient(PsClientOptions options, ShardMap map)
    : options_(std::move(options)),
      num_shards_(map.num_shards()),
      map_(std::move(map)),
      map_epoch_(map_.epoch()),
      map_asks_(std::make_shared<MapAsks>()) {}

PsClient::~PsClient() {
  // An ask still in flight completes without following its answer.
  absl::MutexLock l(&map_asks_->mu);
  map_asks_->alive = false;
}

namespace {

// The addresses of `options` (from the router when there is one), checked.
absl::Status ResolveServers(PsClientOptions* options) {
  if (options->router != nullptr) {
    const int n = options->router->num_shards();
    if (n < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("PsClient: the router knows ", n, " shards"));
    }
    if (!options->servers.empty() &&
        options->servers.size() != static_cast<size_t>(n)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "PsClient: ", options->servers.size(),
          " server addresses given, but the shard map has ", n, " shards"));
    }
    options->servers.resize(n);
    for (int s = 0; s < n; ++s) {
      options->servers[s] = options->router->Address(s);
    }
    return absl::OkStatus();
  }
  if (options->servers.empty()) {
    return absl::InvalidArgumentError("PsClient: no servers given");
  }
  for (size_t i = 0; i < options->servers.size(); ++i) {
    if (options->servers[i].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("PsClient: server address ", i, " is empty"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Connect(
    PsClientOptions options) {
  // Read before the addresses: a change in between is followed later.
  const uint64_t generation =
      options.router != nullptr ? options.router->generation() : 0;
  if (absl::Status s = ResolveServers(&options); !s.ok()) return s;
  absl::StatusOr<ShardMap> map =
      ShardMap::Static(static_cast<int>(options.servers.size()));
  if (!map.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("PsClient: ", map.status().message()));
  }
  if (options.worker_id < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PsClient: worker_id must be >= 0, got ", options.worker_id));
  }
  const RetryPolicy& r = options.retry;
  if (r.call_deadline <= absl::ZeroDuration() ||
      r.attempt_timeout <= absl::ZeroDuration() ||
      r.initial_backoff < absl::ZeroDuration() ||
      r.max_backoff < r.initial_backoff) {
    return absl::InvalidArgumentError(
        "PsClient: call_deadline and attempt_timeout must be > 0, and "
        "0 <= initial_backoff <= max_backoff");
  }
  if (options.connections_per_shard < 1 || options.connections_per_shard > 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("PsClient: connections_per_shard must be in [1, 16], got ",
                     options.connections_per_shard));
  }
  if (absl::Status s = ChannelCredentials(options.security).status(); !s.ok()) {
    return s;
  }
  if (options.clock == nullptr) options.clock = Clock::Monotonic();
  if (options.logger == nullptr) options.logger = NullLogger();
  if (options.incarnation == 0) {
    absl::BitGen gen;
    options.incarnation = absl::Uniform<uint64_t>(
        absl::IntervalClosed, gen, 1, std::numeric_limits<uint64_t>::max());
  }
  std::unique_ptr<PsClient> client(new PsClient(std::move(options), *map));
  {
    absl::MutexLock l(&client->route_mu_);
    for (const std::string& address : client->options_.servers) {
      client->shards_.push_back(std::make_unique<Shard>());
      if (address.empty()) continue;  // the router knows none yet
      client->endpoints_.push_back(client->OpenEndpoint(address));
      client->shards_.back()->current.store(client->endpoints_.back().get());
    }
    client->seen_generation_.store(generation);
  }
  {
    absl::MutexLock l(&client->mu_);
    client->epochs_.assign(client->shards_.size(), 0);
  }
  return client;
}

std::unique_ptr<PsClient::Endpoint> PsClient::OpenEndpoint(
    const std::string& address) const {
  auto endpoint = std::make_unique<Endpoint>();
  endpoint->address = address;
  for (int c = 0; c < options_.connections_per_shard; ++c) {
    std::shared_ptr<grpc::Channel> channel =
        MakeChannel(address, c, options_.security);
    if (c == 0) {
      endpoint->channel = channel;
      endpoint->stub = ParameterServer::NewStub(channel);
    }
    endpoint->pulls.push_back(std::make_unique<DataStream>(
        channel, kPullStreamMethod, PullAnswerId, &queue_));
    endpoint->pushes.push_back(std::make_unique<DataStream>(
        channel, kPushStreamMethod, PushAnswerId, &queue_));
    endpoint->steps.push_back(std::make_unique<DataStream>(
        channel, kStepStreamMethod, PullAnswerId, &queue_));
  }
  return endpoint;
}

PsClient::Endpoint* PsClient::EndpointOf(int shard) const {
  if (options_.router != nullptr &&
      options_.router->generation() !=
          seen_generation_.load(std::memory_order_acquire)) {
    FollowRouter();
  }
  return shards_[shard]->current.load(std::memory_order_acquire);
}

void PsClient::FollowRouter() const {
  absl::MutexLock l(&route_mu_);
  const uint64_t generation = options_.router->generation();
  if (generation == seen_generation_.load(std::memory_order_acquire)) return;
  for (int s = 0; s < num_shards(); ++s) {
    const std::string address = options_.router->Address(s);
    Endpoint* now = shards_[s]->current.load(std::memory_order_acquire);
    const std::string was = now != nullptr ? now->address : "";
    if (address == was) continue;
    Endpoint* next = nullptr;
    if (!address.empty()) {
      // An address this client talked to before keeps its channels.
      for (const std::unique_ptr<Endpoint>& e : endpoints_) {
        if (e->address == address) next = e.get();
      }
      if (next == nullptr) {
        endpoints_.push_back(OpenEndpoint(address));
        next = endpoints_.back().get();
      }
    }
    shards_[s]->current.store(next, std::memory_order_release);
    options_.logger->info("shard {} moved from {} to {}", s,
                          was.empty() ? "(none)" : was,
                          address.empty() ? "(none: no primary now)" : address);
  }
  seen_generation_.store(generation, std::memory_order_release);
}

void PsClient::ReapFinishedStreams() const {
  absl::MutexLock l(&route_mu_);
  for (const std::unique_ptr<Endpoint>& e : endpoints_) {
    for (const auto& stream : e->pulls) stream->ReapFinished();
    for (const auto& stream : e->pushes) stream->ReapFinished();
    for (const auto& stream : e->steps) stream->ReapFinished();
  }
}

absl::Status PsClient::NoAddress(int shard) const {
  return absl::UnavailableError(absl::StrCat(
      "shard ", shard, " has no primary now (the shard map names none)"));
}

FanOut::Call PsClient::StreamCall(
    int shard, bool push, uint32_t connection, std::atomic<DataStream*>* last,
    std::function<void(DataStream*, FanOut::Done)> send) const {
  FanOut::Call call;
  call.shard = shard;
  call.start = [this, shard, push, connection, last, send = std::move(send)](
                   grpc::ClientContext*, FanOut::Done done) {
    const Endpoint* endpoint = EndpointOf(shard);
    if (endpoint == nullptr) return done(NoAddress(shard));
    const auto& streams = push ? endpoint->pushes : endpoint->pulls;
    DataStream* stream = streams[connection % streams.size()].get();
    last->store(stream, std::memory_order_release);
    send(stream, std::move(done));
  };
  call.cancel = [last] {
    DataStream* stream = last->load(std::memory_order_acquire);
    if (stream != nullptr) stream->Cancel();
  };
  return call;
}

std::string PsClient::ShardName(int shard) const {
  const Endpoint* e = shards_[shard]->current.load(std::memory_order_acquire);
  return absl::StrCat("shard ", shard, " (",
                      e != nullptr ? e->address : "no primary known", ")");
}

FanOutEnv PsClient::Env() const {
  FanOutEnv env;
  env.clock = options_.clock;
  env.logger = options_.logger;
  env.shard_name = [this](int shard) { return ShardName(shard); };
  env.queue = &queue_;
  return env;
}

void PsClient::SetPullCaller(int64_t clock, int64_t for_clock,
                             PullRequest* request) const {
  request->set_map_epoch(map().epoch());
  if (options_.reader) {
    request->set_read_only(true);
    return;
  }
  *request->mutable_worker() = MakeWorkerRef(clock);
  request->set_for_clock(for_clock);
}

absl::Status PsClient::CheckNotReader(const char* what) const {
  if (!options_.reader) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(what, ": a reader client only reads"));
}

WorkerRef PsClient::MakeWorkerRef(int64_t clock) const {
  WorkerRef ref;
  ref.set_worker_id(options_.worker_id);
  ref.set_incarnation(options_.incarnation);
  ref.set_clock(clock);
  ref.set_trained(trained_.load(std::memory_order_relaxed));
  return ref;
}

RetryPolicy PsClient::WaitPolicy() const {
  RetryPolicy p = options_.retry;
  p.stop = options_.stop;
  p.poll = options_.poll_stop;
  return p;
}

bool PsClient::Stopped() const {
  if (options_.stop == nullptr) return false;
  if (options_.poll_stop) options_.poll_stop();
  return options_.stop->load();
}

void PsClient::SleepUnlessStopped(absl::Duration d) const {
  if (options_.stop == nullptr) {
    absl::SleepFor(d);
    return;
  }
  const absl::Time end = options_.clock->Now() + d;
  for (absl::Time now = options_.clock->Now(); now < end && !Stopped();
       now = options_.clock->Now()) {
    absl::SleepFor(std::min(end - now, absl::Milliseconds(100)));
  }
}

RetryPolicy PsClient::CallPolicy() const {
  return options_.stop_ends_pushes ? WaitPolicy() : options_.retry;
}

std::optional<ShardMapProto> PsClient::StaleRoute(int shard,
                                                  uint64_t routed) const {
  // The common case, on every send: one atomic load.
  if (map_epoch_.load(std::memory_order_acquire) <= routed || routed == 0) {
    return std::nullopt;
  }
  absl::MutexLock l(&mu_);
  const std::vector<int>& serving = map_.serving_shards();
  if (std::binary_search(serving.begin(), serving.end(), shard)) {
    return std::nullopt;
  }
  ShardMapProto newer;
  ShardMapToProto(map_, &newer);
  return newer;
}

void PsClient::AskForNewerMap(int shard) {
  if (!map().slotted()) return;
  const std::vector<int> serving = Parts();
  const Endpoint* endpoint = nullptr;
  {
    absl::MutexLock l(&map_asks_->mu);
    const absl::Time now = options_.clock->Now();
    if (map_asks_->in_flight ||
        now - map_asks_->last < absl::Milliseconds(500)) {
      return;
    }
    int target = -1;
    for (size_t i = 0; i < serving.size() && target < 0; ++i) {
      const int s = serving[(map_asks_->next + i) % serving.size()];
      if (s != shard) target = s;
    }
    endpoint = target < 0 ? nullptr : EndpointOf(target);
    if (endpoint == nullptr) return;
    ++map_asks_->next;
    map_asks_->in_flight = true;
    map_asks_->last = now;
  }
  struct Ask {
    grpc::ClientContext ctx;
    ListTensorsResponse response;
  };
  auto ask = std::make_shared<Ask>();
  ask->ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  queue_.StartUnary(endpoint->stub->PrepareAsyncListTensors(
                        &ask->ctx, ListTensorsRequest(), queue_.cq()),
                    &ask->response,
                    [this, ask, asks = map_asks_](grpc::Status st) {
                      absl::MutexLock l(&asks->mu);
                      asks->in_flight = false;
                      if (asks->alive && st.ok() && ask->response.has_map()) {
                        LearnMap(ask->response.map());
                      }
                    });
}

void PsClient::HandMapIfBehind(int shard, const absl::Status& refused) {
  const std::optional<uint64_t> served = ServedMapEpoch(refused);
  if (!served.has_value() || options_.router != nullptr) return;
  struct Hand {
    grpc::ClientContext ctx;
    std::unique_ptr<SlotMoves::Stub> stub;
    AdoptMapRequest request;
    AdoptMapResponse response;
  };
  auto hand = std::make_shared<Hand>();
  {
    absl::MutexLock l(&mu_);
    if (!map_.slotted() || map_.epoch() <= *served) return;
    ShardMapToProto(map_, hand->request.mutable_map());
  }
  const Endpoint* endpoint = EndpointOf(shard);
  if (endpoint == nullptr) return;
  {
    absl::MutexLock l(&map_asks_->mu);
    const absl::Time now = options_.clock->Now();
    auto [last, first] = map_asks_->handed.try_emplace(shard, now);
    if (map_asks_->handing ||
        (!first && now - last->second < absl::Milliseconds(500))) {
      return;
    }
    last->second = now;
    map_asks_->handing = true;
  }
  hand->stub = SlotMoves::NewStub(endpoint->channel);
  hand->ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  const uint64_t epoch = hand->request.map().epoch();
  queue_.StartUnary(
      hand->stub->PrepareAsyncAdoptMap(&hand->ctx, hand->request, queue_.cq()),
      &hand->response,
      [this, hand, shard, served = *served, epoch,
       asks = map_asks_](grpc::Status st) {
        absl::MutexLock l(&asks->mu);
        asks->handing = false;
        if (!asks->alive) return;
        if (st.ok()) {
          options_.logger->info(
              "{} served map epoch {}, behind this client's {}: handed it the "
              "map (as psctl adopt does); it serves epoch {} now",
              ShardName(shard), served, epoch, hand->response.map().epoch());
          return;
        }
        // A move of its slots under way ends with the map anyway; a map that
        // gives it slots is refused (only a move, or with etcd the shard's
        // own catch-up, gives a shard slots).
        const absl::Time now = options_.clock->Now();
        if (st.error_code() == grpc::StatusCode::UNAVAILABLE ||
            now - asks->warned < absl::Seconds(10)) {
          options_.logger->debug("{} did not take map epoch {}: {}",
                                 ShardName(shard), epoch, st.error_message());
          return;
        }
        asks->warned = now;
        options_.logger->warn(
            "{} serves map epoch {}, behind this client's {}, and did not "
            "take the map: {}",
            ShardName(shard), served, epoch, st.error_message());
      });
}

void PsClient::LearnMap(const ShardMapProto& newer) {
  absl::StatusOr<ShardMap> map = ShardMapFromProto(newer);
  absl::Status s = map.ok() ? FollowMap(*map) : map.status();
  // The call that was refused follows the map again and reports it.
  if (!s.ok())
    options_.logger->debug("not following a refusal's map: {}", s.ToString());
}

std::vector<int> PsClient::Parts() const {
  absl::MutexLock l(&mu_);
  return map_.serving_shards();
}

void PsClient::ReportTrained(int64_t steps) {
  int64_t now = trained_.load(std::memory_order_relaxed);
  while (steps > now && !trained_.compare_exchange_weak(
                            now, steps, std::memory_order_relaxed)) {
  }
}

std::vector<absl::Status> PsClient::ProbeShards(
    std::vector<ListTensorsResponse>* responses) {
  // One attempt per shard, so that the caller names who is still missing
  // every few seconds.
  RetryPolicy round = WaitPolicy();
  round.call_deadline = absl::Seconds(2);
  round.attempt_timeout = absl::Seconds(2);
  round.report_every = absl::InfiniteDuration();
  round.max_attempts = 1;  // the caller retries, and diagnoses in between
  const ListTensorsRequest request;
  responses->assign(num_shards(), ListTensorsResponse());
  std::vector<FanOut::Call> calls;
  for (int s = 0; s < num_shards(); ++s) {
    FanOut::Call call;
    call.shard = s;
    call.start = [this, s, &request, responses](grpc::ClientContext* ctx,
                                                FanOut::Done done) {
      Endpoint* endpoint = EndpointOf(s);
      if (endpoint == nullptr) return done(NoAddress(s));
      queue_.StartUnary(
          endpoint->stub->PrepareAsyncListTensors(ctx, request, queue_.cq()),
          &(*responses)[s], [done = std::move(done)](grpc::Status st) {
            done(FromGrpcStatus(st));
          });
    };
    calls.push_back(std::move(call));
  }
  FanOutEnv env = Env();
  env.logger = NullLogger();  // the caller reports for itself
  FanOut fanout(env, "ListTensors", round, /*stop_on_error=*/false);
  fanout.Start(std::move(calls));
  return fanout.WaitAll();
}

void PsClient::DiagnoseShards(const std::vector<absl::Status>& results,
                              std::vector<std::string>* causes) {
  // A shard that listens but cannot be talked to (TLS on one side only, a
  // certificate refused) is named at once, not after the wait. A probe may
  // take seconds (an unreachable host), so only the first few missing
  // shards are probed per round.
  int probed = 0;
  for (int s = 0; s < num_shards() && probed < kShardsProbedPerRound; ++s) {
    if (results[s].ok()) continue;
    const Endpoint* endpoint = EndpointOf(s);
    if (endpoint == nullptr) continue;  // nothing to probe
    ++probed;
    bool reached = false;
    const std::string cause = DiagnoseConnection(
        endpoint->address, options_.security, absl::Seconds(1), &reached);
    if (reached && !cause.empty() && cause != (*causes)[s]) {
      options_.logger->error("{}: {}", ShardName(s), cause);
    }
    (*causes)[s] = cause;
  }
}

// Per shard: whether WaitForShards waits for it. Every shard, unless a
// shard that answered serves a slotted map under which the others own no
// slot (ps_server --serving_shards, psctl scale): those may be stopped.
// The newest answered map decides (a shard behind a move may serve an
// older one).
std::vector<bool> PsClient::NeededShards(
    const std::vector<absl::Status>& results,
    const std::vector<ListTensorsResponse>& responses) const {
  std::optional<ShardMap> newest;
  for (int s = 0; s < num_shards(); ++s) {
    if (!results[s].ok()) continue;
    absl::StatusOr<ShardMap> m = ShardMapOr(responses[s].map(), num_shards());
    if (m.ok() && m->num_shards() == num_shards() &&
        (!newest.has_value() || m->epoch() > newest->epoch())) {
      newest = *std::move(m);
    }
  }
  std::vector<bool> needed(num_shards(), true);
  if (!newest.has_value() || !newest->slotted()) return needed;
  std::fill(needed.begin(), needed.end(), false);
  for (const int s : newest->serving_shards()) needed[s] = true;
  return needed;
}

absl::Status PsClient::WaitForShards(absl::Duration timeout) {
  const absl::Time start = options_.clock->Now();
  const absl::Time deadline = start + timeout;
  absl::Time last_report = start;
  absl::Duration interval = options_.retry.initial_backoff;
  // Per shard: why it cannot be reached, when a probe connection named a
  // cause (common/connection_check.h).
  std::vector<std::string> causes(num_shards());
  bool diagnosed = false;
  for (;;) {
    std::vector<ListTensorsResponse> responses;
    const std::vector<absl::Status> results = ProbeShards(&responses);
    if (Stopped()) {
      return absl::CancelledError(
          "stopped while waiting for the shards (the process was asked to "
          "stop)");
    }
    std::vector<std::string> missing;
    const std::vector<bool> needed = NeededShards(results, responses);
    for (int s = 0; s < num_shards(); ++s) {
      if (results[s].ok()) {
        if (responses[s].run_id() != options_.run_id) {
          return absl::FailedPreconditionError(absl::StrCat(
              ShardName(s), " belongs to run '", responses[s].run_id(),
              "', this worker to run '", options_.run_id,
              "': start shards and workers with the same --run_id"));
        }
        continue;
      }
      if (!needed[s]) continue;
      if (!IsRetriable(results[s])) return results[s];
      missing.push_back(ShardName(s));
    }
    if (missing.empty()) {
      // Route by the newest map the shards answered with from here on (its
      // serving shards are the ones control calls go to).
      std::vector<const ShardMapProto*> maps(num_shards(), nullptr);
      for (int s = 0; s < num_shards(); ++s) {
        if (results[s].ok()) maps[s] = &responses[s].map();
      }
      if (absl::Status s = AdoptMap(maps); !s.ok()) return s;
      if (options_.clock->Now() - start > absl::Seconds(1)) {
        options_.logger->info(
            "all {} shards answer (waited {})", num_shards(),
            absl::FormatDuration(absl::Trunc(options_.clock->Now() - start,
                                             absl::Milliseconds(1))));
      }
      return absl::OkStatus();
    }
    const absl::Time now = options_.clock->Now();
    const bool report = now - last_report >= kShardWaitReport;
    if (!diagnosed || report) {
      diagnosed = true;
      DiagnoseShards(results, &causes);
    }
    if (now >= deadline) {
      std::vector<std::string> named;
      for (int s = 0; s < num_shards(); ++s) {
        if (results[s].ok() || !needed[s]) continue;
        named.push_back(causes[s].empty()
                            ? ShardName(s)
                            : absl::StrCat(ShardName(s), ": ", causes[s]));
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "shards not reachable after ", absl::FormatDuration(timeout), ": ",
          absl::StrJoin(named, "; ")));
    }
    if (report) {
      last_report = now;
      options_.logger->info(
          "waiting for {} of {} shards ({} of {}): {}", missing.size(),
          num_shards(),
          absl::FormatDuration(absl::Trunc(now - start, absl::Seconds(1))),
          absl::FormatDuration(timeout), absl::StrJoin(missing, ", "));
    }
    SleepUnlessStopped(std::min(interval, deadline - now));
    interval = std::min(interval * 2, kMaxPollInterval);
  }
}

absl::StatusOr<Registration> PsClient::Register() {
  if (absl::Status s = CheckNotReader("Register"); !s.ok()) return s;
  HeartbeatRequest request;
  *request.mutable_worker() = MakeWorkerRef(0);
  request.set_run_id(options_.run_id);
  std::vector<HeartbeatResponse> responses;
  const std::vector<int> parts = Parts();
  absl::Status s = ToAllShards(parts, "Heartbeat", request, &responses,
                               PrepareHeartbeat, nullptr, WaitPolicy());
  if (!s.ok()) return s;
  Registration r;
  for (const int i : parts) {
    r.resume_clock = std::max(r.resume_clock, responses[i].resume_clock());
    r.previous_clock =
        std::max(r.previous_clock, responses[i].previous_clock());
    r.trained = std::max(r.trained, responses[i].trained());
    NoteEpoch(i, responses[i].shard_epoch());
  }
  return r;
}

void PsClient::NoteEpoch(int shard, uint64_t epoch) {
  if (epoch == 0) return;
  uint64_t before;
  {
    absl::MutexLock l(&mu_);
    before = epochs_[shard];
    epochs_[shard] = epoch;
  }
  if (before != 0 && before != epoch) {
    options_.logger->warn(
        "{} restarted (epoch {:016x} -> {:016x}): it serves the parameters of "
        "its last checkpoint, so updates acknowledged after that checkpoint "
        "are gone; gradients computed from earlier pulls are refused and "
        "training continues from the restored values",
        ShardName(shard), before, epoch);
  }
}

// ---------------------------------------------------------------- calls

std::unique_ptr<grpc::ClientAsyncResponseReader<CreateTensorResponse>>
PrepareCreateTensor(ParameterServer::Stub* stub, grpc::ClientContext* ctx,
                    const CreateTensorRequest& request,
                    grpc::CompletionQueue* cq) {
  return stub->PrepareAsyncCreateTensor(ctx, request, cq);
}

// ---------------------------------------------------------------- other

absl::Status PsClient::Heartbeat(int64_t clock, bool leaving) {
  if (absl::Status s = CheckNotReader("Heartbeat"); !s.ok()) return s;
  HeartbeatRequest request;
  *request.mutable_worker() = MakeWorkerRef(clock);
  request.set_leaving(leaving);
  request.set_run_id(options_.run_id);
  std::vector<HeartbeatResponse> responses;
  return ToAllShards(Parts(), "Heartbeat", request, &responses,
                     PrepareHeartbeat, nullptr, CallPolicy());
}

absl::StatusOr<ListTensorsResponse> PsClient::ListTensors() {
  const ListTensorsRequest request;
  std::vector<ListTensorsResponse> responses;
  const std::vector<int> parts = Parts();
  absl::Status status = ToAllShards(
      parts, "ListTensors", request, &responses,
      [](ParameterServer::Stub* stub, grpc::ClientContext* ctx,
         const ListTensorsRequest& req, grpc::CompletionQueue* cq) {
        return stub->PrepareAsyncListTensors(ctx, req, cq);
      },
      nullptr, CallPolicy());
  if (!status.ok()) return status;
  // What every shard holds.
  absl::flat_hash_map<std::string, size_t> tensors, tables;
  for (const int s : parts) {
    for (const TensorSpec& t : responses[s].tensors()) ++tensors[t.name()];
    for (const TableSpec& t : responses[s].tables()) ++tables[t.name()];
  }
  const ListTensorsResponse& first = responses[parts[0]];
  ListTensorsResponse out;
  out.set_run_id(first.run_id());
  for (const TensorSpec& t : first.tensors()) {
    if (tensors[t.name()] == parts.size()) *out.add_tensors() = t;
  }
  for (const TableSpec& t : first.tables()) {
    if (tables[t.name()] == parts.size()) *out.add_tables() = t;
  }
  return out;
}

absl::StatusOr<std::vector<LearningRate>> PsClient::SetLearningRates(
    const std::vector<LearningRate>& rates) {
  SetLearningRateRequest request;
  for (const LearningRate& r : rates) *request.add_rates() = r;
  std::vector<SetLearningRateResponse> responses;
  const std::vector<int> parts = Parts();
  absl::Status status = ToAllShards(
      parts, "SetLearningRate", request, &responses,
      [](ParameterServer::Stub* stub, grpc::ClientContext* ctx,
         const SetLearningRateRequest& req, grpc::CompletionQueue* cq) {
        return stub->PrepareAsyncSetLearningRate(ctx, req, cq);
      },
      nullptr, CallPolicy());
  if (!status.ok()) return status;
  std::vector<LearningRate> out = rates;
  for (const int s : parts) {
    const SetLearningRateResponse& r = responses[s];
    if (r.rates_size() != static_cast<int>(out.size())) {
      return absl::InternalError(
          absl::StrCat("a shard answered SetLearningRate with ", r.rates_size(),
                       " rates for ", out.size(), " asked"));
    }
    for (size_t i = 0; i < out.size(); ++i) {
      if (r.rates(i).step() > out[i].step()) out[i] = r.rates(i);
    }
  }
  return out;
}

absl::StatusOr<std::vector<StatusResponse>> PsClient::Status() {
  const StatusRequest request;
  std::vector<StatusResponse> responses;
  absl::Status status = ToAllShards(
      Parts(), "Status", request, &responses,
      [](ParameterServer::Stub* stub, grpc::ClientContext* ctx,
         const StatusRequest& req, grpc::CompletionQueue* cq) {
        return stub->PrepareAsyncStatus(ctx, req, cq);
      },
      nullptr, CallPolicy());
  if (!status.ok()) return status;
  return responses;
}

}  // namespace asyncps
