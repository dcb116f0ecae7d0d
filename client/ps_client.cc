#include "client/ps_client.h"

#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <cstring>
#include <limits>

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
#include "common/sharding.h"

namespace asyncps {

namespace {

constexpr absl::Duration kMaxListPollInterval = absl::Seconds(1);
constexpr absl::Duration kShardWaitReport = absl::Seconds(5);
constexpr int kShardsProbedPerRound = 4;

// Starts one Heartbeat attempt (for ToAllShards).
void IssueHeartbeat(ParameterServer::Stub* stub, grpc::ClientContext* ctx,
                    const HeartbeatRequest* request,
                    HeartbeatResponse* response,
                    std::function<void(grpc::Status)> done) {
  stub->async()->Heartbeat(ctx, request, response, std::move(done));
}

absl::Status Annotate(const absl::Status& s, absl::string_view prefix) {
  return absl::Status(s.code(), absl::StrCat(prefix, ": ", s.message()));
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

PsClient::PsClient(PsClientOptions options) : options_(std::move(options)) {}

PsClient::~PsClient() = default;

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Connect(
    PsClientOptions options) {
  if (options.servers.empty()) {
    return absl::InvalidArgumentError("PsClient: no servers given");
  }
  for (size_t i = 0; i < options.servers.size(); ++i) {
    if (options.servers[i].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("PsClient: server address ", i, " is empty"));
    }
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
  if (options.clock == nullptr) options.clock = Clock::Real();
  if (options.logger == nullptr) options.logger = NullLogger();
  if (options.incarnation == 0) {
    absl::BitGen gen;
    options.incarnation = absl::Uniform<uint64_t>(
        absl::IntervalClosed, gen, 1, std::numeric_limits<uint64_t>::max());
  }
  std::unique_ptr<PsClient> client(new PsClient(std::move(options)));
  const PsClientOptions& o = client->options_;
  for (const std::string& address : o.servers) {
    auto shard = std::make_unique<Shard>();
    shard->address = address;
    for (int c = 0; c < o.connections_per_shard; ++c) {
      std::shared_ptr<grpc::Channel> channel =
          MakeChannel(address, c, o.security);
      if (c == 0) shard->stub = ParameterServer::NewStub(channel);
      shard->pulls.push_back(std::make_unique<DataStream>(
          channel, kPullStreamMethod, PullAnswerId));
      shard->pushes.push_back(std::make_unique<DataStream>(
          channel, kPushStreamMethod, PushAnswerId));
    }
    client->shards_.push_back(std::move(shard));
  }
  {
    absl::MutexLock l(&client->mu_);
    client->epochs_.assign(client->shards_.size(), 0);
  }
  return client;
}

std::string PsClient::ShardName(int shard) const {
  return absl::StrCat("shard ", shard, " (", shards_[shard]->address, ")");
}

FanOutEnv PsClient::Env() const {
  FanOutEnv env;
  env.clock = options_.clock;
  env.logger = options_.logger;
  env.shard_name = [this](int shard) { return ShardName(shard); };
  return env;
}

void PsClient::SetPullCaller(int64_t clock, int64_t for_clock,
                             PullRequest* request) const {
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
  return p;
}

RetryPolicy PsClient::CallPolicy() const {
  return options_.stop_ends_pushes ? WaitPolicy() : options_.retry;
}

void PsClient::ReportTrained(int64_t steps) {
  int64_t now = trained_.load(std::memory_order_relaxed);
  while (steps > now && !trained_.compare_exchange_weak(
                            now, steps, std::memory_order_relaxed)) {
  }
}

absl::Status PsClient::WaitForShards(absl::Duration timeout) {
  const absl::Time start = options_.clock->Now();
  const absl::Time deadline = start + timeout;
  // Short rounds, each one attempt per shard, so that the log names who is
  // still missing every few seconds.
  RetryPolicy round = WaitPolicy();
  round.call_deadline = absl::Seconds(2);
  round.attempt_timeout = absl::Seconds(2);
  round.report_every = absl::InfiniteDuration();
  round.max_attempts = 1;  // this loop retries, and diagnoses in between
  absl::Time last_report = start;
  absl::Duration interval = options_.retry.initial_backoff;
  // Per shard: why it cannot be reached, when a probe connection named a
  // cause (common/connection_check.h).
  std::vector<std::string> causes(num_shards());
  bool diagnosed = false;
  for (;;) {
    const ListTensorsRequest request;
    std::vector<ListTensorsResponse> responses(num_shards());
    std::vector<FanOut::Call> calls;
    for (int s = 0; s < num_shards(); ++s) {
      FanOut::Call call;
      call.shard = s;
      call.start = [this, s, &request, &responses](grpc::ClientContext* ctx,
                                                   FanOut::Done done) {
        shards_[s]->stub->async()->ListTensors(
            ctx, &request, &responses[s],
            [done = std::move(done)](grpc::Status st) {
              done(FromGrpcStatus(st));
            });
      };
      calls.push_back(std::move(call));
    }
    FanOutEnv env = Env();
    env.logger = NullLogger();  // this loop reports for itself
    FanOut fanout(env, "ListTensors", round, /*stop_on_error=*/false);
    fanout.Start(std::move(calls));
    const std::vector<absl::Status> results = fanout.WaitAll();
    if (options_.stop != nullptr && options_.stop->load()) {
      return absl::CancelledError(
          "stopped while waiting for the shards (the process was asked to "
          "stop)");
    }
    std::vector<std::string> missing;
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
      if (!IsRetriable(results[s])) return results[s];
      missing.push_back(ShardName(s));
    }
    if (missing.empty()) {
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
      // A shard that listens but cannot be talked to (TLS on one side only,
      // a certificate refused) is named at once, not after the wait. A
      // probe may take seconds (an unreachable host), so only the first
      // few missing shards are probed per round.
      diagnosed = true;
      int probed = 0;
      for (int s = 0; s < num_shards() && probed < kShardsProbedPerRound; ++s) {
        if (results[s].ok()) continue;
        ++probed;
        bool reached = false;
        const std::string cause = DiagnoseConnection(
            shards_[s]->address, options_.security, absl::Seconds(1), &reached);
        if (reached && !cause.empty() && cause != causes[s]) {
          options_.logger->error("{}: {}", ShardName(s), cause);
        }
        causes[s] = cause;
      }
    }
    if (now >= deadline) {
      std::vector<std::string> named;
      for (int s = 0; s < num_shards(); ++s) {
        if (results[s].ok()) continue;
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
    absl::SleepFor(std::min(interval, deadline - now));
    interval = std::min(interval * 2, kMaxListPollInterval);
  }
}

absl::StatusOr<Registration> PsClient::Register() {
  if (absl::Status s = CheckNotReader("Register"); !s.ok()) return s;
  HeartbeatRequest request;
  *request.mutable_worker() = MakeWorkerRef(0);
  request.set_run_id(options_.run_id);
  std::vector<HeartbeatResponse> responses;
  absl::Status s = ToAllShards("Heartbeat", request, &responses, IssueHeartbeat,
                               nullptr, WaitPolicy());
  if (!s.ok()) return s;
  Registration r;
  for (int i = 0; i < num_shards(); ++i) {
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

// ---------------------------------------------------------------- tensors

absl::Status PsClient::Remember(const TensorSpec& spec) {
  absl::StatusOr<TensorLayout> layout = TensorLayout::FromSpec(spec);
  if (!layout.ok()) {
    return Annotate(layout.status(),
                    absl::StrCat("tensor ", QuoteName(spec.name())));
  }
  const int n = num_shards();
  auto state = std::make_unique<TensorState>(
      TensorState{spec, *layout, {}, std::vector<uint32_t>(n, 0)});
  state->home.resize(layout->num_slices());
  for (uint32_t i = 0; i < layout->num_slices(); ++i) {
    state->home[i] = SliceHome(spec.name(), i, n);
    ++state->slices_on[state->home[i]];
  }
  absl::MutexLock l(&mu_);
  return RememberOnce(&tensors_, std::move(state), "tensor");
}

const PsClient::TensorState* PsClient::FindTensor(
    const std::string& name) const {
  absl::MutexLock l(&mu_);
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second.get();
}

const TensorSpec* PsClient::FindSpec(const std::string& name) const {
  const TensorState* t = FindTensor(name);
  return t == nullptr ? nullptr : &t->spec;
}

std::vector<uint64_t> PsClient::PulledVersions(const std::string& name) const {
  absl::MutexLock l(&mu_);
  auto it = last_read_.versions.find(name);
  return it == last_read_.versions.end() ? std::vector<uint64_t>() : it->second;
}

absl::Status PsClient::CreateTensors(
    const std::vector<TensorSpec>& specs,
    const std::vector<std::pair<std::string, const float*>>& values) {
  absl::flat_hash_set<std::string> names;
  for (const TensorSpec& spec : specs) {
    absl::Status s = CheckName("CreateTensors: tensor name", spec.name());
    if (!s.ok()) return s;
    if (!names.insert(spec.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CreateTensors: tensor ", QuoteName(spec.name()), " given twice"));
    }
    if (spec.slice_elems() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("CreateTensors: tensor ", QuoteName(spec.name()),
                       ": slice_elems must be >= 0, got ", spec.slice_elems()));
    }
    absl::StatusOr<TensorLayout> layout = TensorLayout::Create(
        std::vector<int64_t>(spec.shape().begin(), spec.shape().end()), 1);
    if (!layout.ok()) {
      return Annotate(layout.status(), absl::StrCat("CreateTensors: tensor ",
                                                    QuoteName(spec.name())));
    }
  }
  if (specs.empty()) return absl::OkStatus();

  const int n = num_shards();
  CreateTensorRequest request;
  for (const TensorSpec& spec : specs) *request.add_tensors() = spec;
  absl::flat_hash_set<std::string> given;
  for (const auto& [name, data] : values) {
    const TensorSpec* spec = nullptr;
    for (const TensorSpec& t : specs) {
      if (t.name() == name) spec = &t;
    }
    if (spec == nullptr || spec->init() != INIT_VALUES || data == nullptr ||
        !given.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CreateTensors: values given for ", QuoteName(name),
          ", which is not a tensor of this call with init INIT_VALUES (or "
          "given twice, or null)"));
    }
    const int64_t elems =
        TensorLayout::Create(
            std::vector<int64_t>(spec->shape().begin(), spec->shape().end()), 1)
            ->num_elems();
    if (!AllFinite(reinterpret_cast<const char*>(data),
                   static_cast<size_t>(elems), WIRE_F32)) {
      return absl::InvalidArgumentError(
          absl::StrCat("CreateTensors: the values of tensor ", QuoteName(name),
                       " contain NaN or Inf; nothing was sent"));
    }
    TensorValues* v = request.add_values();
    v->set_tensor(name);
    EncodeFloats(data, static_cast<size_t>(elems), v->mutable_values());
  }
  for (const TensorSpec& spec : specs) {
    if (spec.init() == INIT_VALUES && !given.contains(spec.name())) {
      return absl::InvalidArgumentError(
          absl::StrCat("CreateTensors: tensor ", QuoteName(spec.name()),
                       " has init INIT_VALUES but no values were given"));
    }
  }
  std::vector<CreateTensorResponse> responses;
  absl::Status status = ToAllShards(
      "CreateTensor", request, &responses, IssueCreateTensor,
      [&specs, &responses](int s) -> absl::Status {
        const CreateTensorResponse& r = responses[s];
        if (r.tensors_size() != static_cast<int>(specs.size())) {
          return absl::InternalError(absl::StrCat("answered ", r.tensors_size(),
                                                  " specs for ", specs.size(),
                                                  " requested"));
        }
        for (size_t k = 0; k < specs.size(); ++k) {
          const TensorSpec& got = r.tensors(static_cast<int>(k));
          if (got.name() != specs[k].name() || got.slice_elems() <= 0 ||
              (specs[k].slice_elems() != 0 &&
               got.slice_elems() != specs[k].slice_elems())) {
            return absl::InternalError(absl::StrCat(
                "answered spec {", got.ShortDebugString(),
                "} for requested tensor ", QuoteName(specs[k].name())));
          }
        }
        return absl::OkStatus();
      },
      CallPolicy());
  if (!status.ok()) return status;

  for (size_t k = 0; k < specs.size(); ++k) {
    const TensorSpec& first = responses[0].tensors(static_cast<int>(k));
    for (int s = 1; s < n; ++s) {
      const TensorSpec& other = responses[s].tensors(static_cast<int>(k));
      if (other.slice_elems() != first.slice_elems()) {
        return absl::FailedPreconditionError(
            absl::StrCat("tensor ", QuoteName(first.name()), ": ", ShardName(0),
                         " resolved slice_elems=", first.slice_elems(), " but ",
                         ShardName(s), " resolved ", other.slice_elems(),
                         "; start every shard with the same --slice_elems"));
      }
      if (!google::protobuf::util::MessageDifferencer::Equals(first, other)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "tensor ", QuoteName(first.name()), " differs between shards: ",
            ShardName(0), " holds {", first.ShortDebugString(), "}, ",
            ShardName(s), " holds {", other.ShortDebugString(), "}"));
      }
    }
  }
  for (size_t k = 0; k < specs.size(); ++k) {
    absl::Status s = Remember(responses[0].tensors(static_cast<int>(k)));
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status PsClient::WaitForTensors(const std::vector<std::string>& names,
                                      absl::Duration timeout) {
  const absl::Time deadline = options_.clock->Now() + timeout;
  const int n = num_shards();
  absl::Duration interval = options_.retry.initial_backoff;
  std::string missing = "no shard answered";
  std::string last_error;
  const absl::Time start = options_.clock->Now();
  absl::Time last_report = start;
  // One attempt per shard per round: polling is the retry.
  RetryPolicy round = WaitPolicy();
  round.call_deadline =
      std::max(absl::Seconds(1), std::min(timeout, absl::Seconds(5)));
  round.report_every = absl::InfiniteDuration();
  for (;;) {
    std::vector<ListTensorsResponse> responses;
    const ListTensorsRequest request;
    absl::Status status = ToAllShards(
        "ListTensors", request, &responses,
        [](ParameterServer::Stub* stub, grpc::ClientContext* ctx,
           const ListTensorsRequest* req, ListTensorsResponse* resp,
           std::function<void(grpc::Status)> done) {
          stub->async()->ListTensors(ctx, req, resp, std::move(done));
        },
        nullptr, round);
    if (!status.ok() && !IsRetriable(status)) return status;
    if (status.ok()) {
      std::vector<absl::flat_hash_map<std::string, const TensorSpec*>> held(n);
      std::vector<absl::flat_hash_map<std::string, const TableSpec*>> tables(n);
      for (int s = 0; s < n; ++s) {
        for (const TensorSpec& spec : responses[s].tensors()) {
          held[s][spec.name()] = &spec;
        }
        for (const TableSpec& spec : responses[s].tables()) {
          tables[s][spec.name()] = &spec;
        }
      }
      // Sparse tables of the names asked for: the same kind and spec on
      // every shard.
      std::vector<std::string> dense;
      for (const std::string& name : names) {
        const bool table = tables[0].contains(name);
        if (!table) dense.push_back(name);
        for (int s = 1; s < n; ++s) {
          auto it = tables[s].find(name);
          if ((table && held[s].contains(name)) ||
              (!table && it != tables[s].end() && held[0].contains(name))) {
            return absl::FailedPreconditionError(absl::StrCat(
                QuoteName(name), " is a tensor on one of ", ShardName(0),
                " and ", ShardName(s), " and a sparse table on the other"));
          }
          if (table && it != tables[s].end() &&
              !google::protobuf::util::MessageDifferencer::Equals(
                  *tables[0][name], *it->second)) {
            return absl::FailedPreconditionError(
                absl::StrCat("table ", QuoteName(name), " differs between ",
                             ShardName(0), " and ", ShardName(s)));
          }
        }
      }
      std::vector<std::string> absent;
      for (const std::string& name : names) {
        for (int s = 0; s < n; ++s) {
          if (!held[s].contains(name) && !tables[s].contains(name)) {
            absent.push_back(
                absl::StrCat(QuoteName(name), " on ", ShardName(s)));
          }
        }
      }
      if (absent.empty()) {
        for (const std::string& name : names) {
          if (tables[0].contains(name)) {
            absl::Status s = RememberTable(*tables[0][name]);
            if (!s.ok()) return s;
          }
        }
        for (const std::string& name : dense) {
          const TensorSpec& first = *held[0][name];
          for (int s = 1; s < n; ++s) {
            if (!google::protobuf::util::MessageDifferencer::Equals(
                    first, *held[s][name])) {
              return absl::FailedPreconditionError(absl::StrCat(
                  "tensor ", QuoteName(name),
                  " differs between shards: ", ShardName(0), " holds {",
                  first.ShortDebugString(), "}, ", ShardName(s), " holds {",
                  held[s][name]->ShortDebugString(), "}"));
            }
          }
        }
        for (const std::string& name : dense) {
          absl::Status s = Remember(*held[0][name]);
          if (!s.ok()) return s;
        }
        return absl::OkStatus();
      }
      missing = absl::StrCat("missing: ", absl::StrJoin(absent, ", "));
      last_error.clear();
    } else {
      last_error = absl::StrCat("; last error: ", status.message());
    }
    if (options_.stop != nullptr && options_.stop->load()) {
      return absl::CancelledError(
          "stopped while waiting for tensors (the process was asked to "
          "stop)");
    }
    const absl::Time now = options_.clock->Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "tensors [", absl::StrJoin(names, ", "),
          "] not on every shard after ", absl::FormatDuration(timeout), "; ",
          missing, last_error));
    }
    if (now - last_report >= kShardWaitReport) {
      last_report = now;
      options_.logger->info(
          "waiting for the tensors another worker creates ({} of {}); {}{}",
          absl::FormatDuration(absl::Trunc(now - start, absl::Seconds(1))),
          absl::FormatDuration(timeout), missing, last_error);
    }
    absl::SleepFor(std::min(interval, deadline - now));
    interval = std::min(interval * 2, kMaxListPollInterval);
  }
}

// ---------------------------------------------------------------- pull

// One shard's part of a pull: the request, where its slices go, and what
// the answer said. Written by the answer's thread while the attempt runs,
// read by the waiting thread once it ended.
struct PsClient::PullShard {
  int shard = 0;
  PullRequest request;
  // Tensor name -> (its state, the caller's buffer), for the tensors asked.
  absl::flat_hash_map<std::string, std::pair<const TensorState*, float*>>
      targets;
  uint32_t slices = 0;  // expected in the answer
  // Of the last successful answer:
  absl::flat_hash_map<std::string, std::vector<std::pair<uint32_t, uint64_t>>>
      versions;  // tensor -> (slice, version)
  uint64_t epoch = 0;
};

PsClient::PendingPull::~PendingPull() = default;

absl::Status PsClient::PendingPull::Finish(absl::Status s) {
  if (!s.ok()) return s;
  for (const auto& ps : shards_) {
    read_.epochs[ps->shard] = ps->epoch;
    for (const auto& [name, list] : ps->versions) {
      std::vector<uint64_t>& v = read_.versions[name];
      for (const auto& [slice, version] : list) v[slice] = version;
    }
  }
  return s;
}

std::unique_ptr<PsClient::PendingPull> PsClient::StartPull(
    int64_t clock, int64_t for_clock,
    const std::vector<std::pair<std::string, float*>>& outs) {
  std::unique_ptr<PendingPull> p(new PendingPull());
  const int n = num_shards();
  p->read_.epochs.assign(n, 0);
  absl::flat_hash_map<std::string, std::pair<const TensorState*, float*>>
      wanted;
  for (const auto& [name, buffer] : outs) {
    const TensorState* t = FindTensor(name);
    if (t == nullptr) {
      p->call_.Fail(absl::NotFoundError(
          absl::StrCat("Pull: unknown tensor ", QuoteName(name),
                       " (create it or wait for it before pulling)")));
      return p;
    }
    if (buffer == nullptr) {
      p->call_.Fail(absl::InvalidArgumentError(
          absl::StrCat("Pull: null buffer for tensor ", QuoteName(name))));
      return p;
    }
    if (!wanted.try_emplace(name, t, buffer).second) {
      p->call_.Fail(absl::InvalidArgumentError(
          absl::StrCat("Pull: tensor ", QuoteName(name), " requested twice")));
      return p;
    }
    p->read_.versions[name].assign(t->layout.num_slices(), 0);
  }
  if (for_clock < clock) {
    p->call_.Fail(absl::InvalidArgumentError(absl::StrCat(
        "Pull: for_clock ", for_clock, " is behind the clock ", clock)));
    return p;
  }
  PendingPull* raw_pull = p.get();
  auto finish = [raw_pull](absl::Status s) { return raw_pull->Finish(s); };
  if (outs.empty()) {
    p->call_.Start(nullptr, finish);
    return p;
  }

  const uint32_t connection = next_connection_++;
  std::vector<FanOut::Call> calls;
  for (int s = 0; s < n; ++s) {
    auto ps = std::make_unique<PullShard>();
    ps->shard = s;
    for (const auto& [name, buffer] : outs) {
      const auto& target = wanted.at(name);
      if (target.first->slices_on[s] == 0) continue;
      ps->request.add_tensors(name);
      ps->targets.emplace(name, target);
      ps->slices += target.first->slices_on[s];
    }
    if (ps->request.tensors_size() == 0) continue;
    SetPullCaller(clock, for_clock, &ps->request);
    ps->request.set_wire_dtype(options_.pull_dtype);
    PullShard* raw = ps.get();
    DataStream* stream =
        shards_[s]->pulls[connection % shards_[s]->pulls.size()].get();
    FanOut::Call call;
    call.shard = s;
    call.start = [this, raw, stream](grpc::ClientContext*, FanOut::Done done) {
      const uint64_t id = next_request_id_++;
      raw->request.set_request_id(id);
      stream->Send(id, SerializeToByteBuffer(raw->request),
                   [this, raw, done = std::move(done)](
                       absl::Status st, grpc::ByteBuffer* answer) {
                     if (st.ok()) st = ReadPull(*answer, raw);
                     done(st);
                   });
    };
    call.cancel = [stream] { stream->Cancel(); };
    calls.push_back(std::move(call));
    p->shards_.push_back(std::move(ps));
  }
  auto fanout = std::make_unique<FanOut>(Env(), "Pull", WaitPolicy());
  fanout->Start(std::move(calls));
  p->call_.Start(std::move(fanout), finish);
  return p;
}

absl::Status PsClient::OpenPullAnswer(const grpc::ByteBuffer& answer, int shard,
                                      PullResponse* header,
                                      FrameReader* frame) {
  absl::Status st = frame->Open(answer, header);
  if (!st.ok()) return absl::InternalError(st.message());
  st = FromCallStatus(header->status());
  if (!st.ok()) return st;
  NoteEpoch(shard, header->shard_epoch());
  const WireDtype dtype = header->wire_dtype();
  if (dtype != WIRE_F32 && dtype != WIRE_BF16) {
    return absl::InternalError(
        absl::StrCat("answered in unknown wire_dtype ", dtype));
  }
  return absl::OkStatus();
}

absl::Status PsClient::ReadPull(const grpc::ByteBuffer& answer, PullShard* ps) {
  PullResponse header;
  FrameReader frame;
  absl::Status st = OpenPullAnswer(answer, ps->shard, &header, &frame);
  if (!st.ok()) return st;
  const WireDtype dtype = header.wire_dtype();
  ps->versions.clear();
  absl::flat_hash_map<std::string, std::vector<bool>> seen;
  uint32_t received = 0;
  for (const SliceData& d : header.slices()) {
    auto it = ps->targets.find(d.tensor());
    if (it == ps->targets.end()) {
      return absl::InternalError(absl::StrCat("returned a slice of tensor ",
                                              QuoteName(d.tensor()),
                                              ", which was not requested"));
    }
    const TensorState& t = *it->second.first;
    if (d.slice() >= t.layout.num_slices() || t.home[d.slice()] != ps->shard) {
      return absl::InternalError(absl::StrCat(
          "returned slice ", d.slice(), " of tensor ", QuoteName(d.tensor()),
          ", which is not one of its ", t.layout.num_slices(),
          " slices homed there (are the shards listed in the order of "
          "their --shard_index?)"));
    }
    std::vector<bool>& got = seen[d.tensor()];
    got.resize(t.layout.num_slices(), false);
    if (got[d.slice()]) {
      return absl::InternalError(absl::StrCat("returned slice ", d.slice(),
                                              " of tensor ",
                                              QuoteName(d.tensor()), " twice"));
    }
    const int64_t elems = t.layout.SliceSize(d.slice());
    const uint64_t bytes = static_cast<uint64_t>(elems) * WireBytes(dtype);
    if (d.payload_bytes() != bytes) {
      return absl::InternalError(absl::StrCat(
          "returned ", d.payload_bytes(), " bytes for slice ", d.slice(),
          " of tensor ", QuoteName(d.tensor()), ", expected ", bytes));
    }
    float* dst = it->second.second + t.layout.SliceBegin(d.slice());
    st = frame.DecodeNext(bytes, dtype, dst);
    if (!st.ok()) return absl::InternalError(st.message());
    got[d.slice()] = true;
    ps->versions[d.tensor()].emplace_back(d.slice(), d.version());
    ++received;
  }
  if (frame.remaining() != 0) {
    return absl::InternalError(absl::StrCat("returned ", frame.remaining(),
                                            " bytes beyond its slices"));
  }
  if (received != ps->slices) {
    return absl::InternalError(
        absl::StrCat("returned ", received, " slices, expected ", ps->slices));
  }
  ps->epoch = header.shard_epoch();
  return absl::OkStatus();
}

absl::Status PsClient::Pull(
    int64_t clock, const std::vector<std::pair<std::string, float*>>& outs) {
  std::unique_ptr<PendingPull> p = StartPull(clock, clock, outs);
  absl::Status s = p->Wait();
  if (!s.ok()) return s;
  absl::MutexLock l(&mu_);
  for (auto& [name, versions] : p->read_.versions) {
    last_read_.versions[name] = versions;
  }
  last_read_.epochs.resize(num_shards(), 0);
  for (int i = 0; i < num_shards(); ++i) {
    if (p->read_.epochs[i] != 0) last_read_.epochs[i] = p->read_.epochs[i];
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- push

struct PsClient::PushShard {
  int shard = 0;
  grpc::ByteBuffer frame;  // built once, sent by every attempt
  PushResponse response;   // of the successful attempt
};

// gRPC's references to the gradient memory: one per slice handed over,
// dropped when gRPC releases that slice.
struct PsClient::Borrowed {
  absl::Mutex mu;
  int64_t refs ABSL_GUARDED_BY(mu) = 0;

  static void Release(void* self) {
    auto* b = static_cast<Borrowed*>(self);
    absl::MutexLock l(&b->mu);
    --b->refs;
  }
  static bool AllReleased(Borrowed* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(b->mu) {
    return b->refs == 0;
  }
};

PsClient::PendingPush::~PendingPush() = default;

absl::StatusOr<PushSummary> PsClient::PendingPush::Finish(absl::Status s) {
  PushSummary summary;
  uint64_t staleness_sum = 0;
  int64_t results = 0;
  // Per tensor: the outcome and how many staleness values it summed
  // (node_hash_map: its entries stay where they are as it grows).
  absl::node_hash_map<std::string, std::pair<TensorPushOutcome, int64_t>> per;
  for (auto& ps : shards_) {
    ps->frame.Clear();  // our own references to the gradient memory
    if (!s.ok()) continue;
    const PushResponse& r = ps->response;
    if (r.duplicate()) ++summary.duplicates;
    std::pair<TensorPushOutcome, int64_t>* t = nullptr;
    const std::string* t_name = nullptr;
    for (const SliceResult& res : r.results()) {
      if (t_name == nullptr || res.tensor() != *t_name) {
        t = &per[res.tensor()];
        t_name = &res.tensor();
      }
      TensorPushOutcome& o = t->first;
      switch (res.outcome()) {
        case APPLIED:
          ++summary.applied;
          ++o.applied;
          break;
        case REFUSED_STALE:
          ++summary.refused_stale;
          ++o.refused_stale;
          break;
        default:
          ++summary.refused_restored;
          ++o.refused_restored;
          continue;
      }
      summary.max_staleness = std::max(summary.max_staleness, res.staleness());
      o.max_staleness = std::max(o.max_staleness, res.staleness());
      o.mean_staleness += static_cast<double>(res.staleness());
      ++t->second;
      staleness_sum += res.staleness();
      ++results;
    }
  }
  for (auto& [name, entry] : per) {
    if (entry.second > 0) entry.first.mean_staleness /= entry.second;
    summary.tensors.emplace(name, entry.first);
  }
  if (borrowed_ != nullptr) {
    // gRPC may still hold slices of a cancelled or failed attempt for a
    // moment; the caller may reuse its memory only after they are released.
    absl::MutexLock l(&borrowed_->mu);
    borrowed_->mu.Await(
        absl::Condition(&Borrowed::AllReleased, borrowed_.get()));
  }
  if (!s.ok()) return s;
  if (results > 0) {
    summary.mean_staleness =
        static_cast<double>(staleness_sum) / static_cast<double>(results);
  }
  return summary;
}

std::unique_ptr<PsClient::PendingPush> PsClient::StartPush(
    int64_t clock,
    const std::vector<std::pair<std::string, const float*>>& grads,
    const ReadSet& read) {
  return StartSend(/*assign=*/false, clock, grads, read);
}

std::unique_ptr<PsClient::PendingPush> PsClient::StartAssign(
    int64_t clock,
    const std::vector<std::pair<std::string, const float*>>& values) {
  return StartSend(/*assign=*/true, clock, values, ReadSet());
}

std::unique_ptr<PsClient::PendingPush> PsClient::StartSend(
    bool assign, int64_t clock,
    const std::vector<std::pair<std::string, const float*>>& grads,
    const ReadSet& read) {
  std::unique_ptr<PendingPush> p(new PendingPush());
  const char* what = assign ? "Assign" : "Push";
  const char* payload = assign ? "values" : "gradient";
  if (absl::Status s = CheckNotReader(what); !s.ok()) {
    p->call_.Fail(s);
    return p;
  }
  std::vector<const TensorState*> states;
  absl::flat_hash_set<std::string> seen;
  int64_t total_elems = 0;
  for (const auto& [name, buffer] : grads) {
    const TensorState* t = FindTensor(name);
    if (t == nullptr) {
      p->call_.Fail(absl::NotFoundError(
          absl::StrCat(what, ": unknown tensor ", QuoteName(name),
                       " (create it or wait for it first)")));
      return p;
    }
    if (buffer == nullptr) {
      p->call_.Fail(absl::InvalidArgumentError(absl::StrCat(
          what, ": null ", payload, " buffer for tensor ", QuoteName(name))));
      return p;
    }
    if (!seen.insert(name).second) {
      p->call_.Fail(absl::InvalidArgumentError(
          absl::StrCat(what, ": tensor ", QuoteName(name), " given twice")));
      return p;
    }
    if (!AllFinite(reinterpret_cast<const char*>(buffer),
                   static_cast<size_t>(t->layout.num_elems()), WIRE_F32)) {
      p->call_.Fail(absl::InvalidArgumentError(
          absl::StrCat(what, ": the ", payload, " of tensor ", QuoteName(name),
                       " contains NaN or Inf; nothing was sent")));
      return p;
    }
    states.push_back(t);
    total_elems += t->layout.num_elems();
  }

  // Every shard gets a request, so that each sees the clock; the sequence
  // number is shared by all of them and by their retries.
  const int n = num_shards();
  const uint64_t seq = next_seq_++;
  // Values are assigned exactly as given, whatever the gradients' wire type.
  const WireDtype dtype = assign ? WIRE_F32 : options_.push_dtype;
  std::vector<PushRequest> headers = PushHeaders(clock, seq, read.epochs);
  for (PushRequest& header : headers) {
    header.set_wire_dtype(dtype);
    header.set_assign(assign);
  }
  std::vector<std::vector<grpc::Slice>> payloads(n);
  // The bytes sent: the caller's floats, or their bfloat16 copy.
  if (dtype == WIRE_BF16) p->bf16_.resize(static_cast<size_t>(total_elems));
  p->borrowed_ = std::make_shared<Borrowed>();
  Borrowed* borrowed = p->borrowed_.get();
  int64_t bf16_at = 0;
  int64_t handed_over = 0;
  for (size_t k = 0; k < grads.size(); ++k) {
    const TensorState& t = *states[k];
    const char* source = reinterpret_cast<const char*>(grads[k].second);
    if (dtype == WIRE_BF16) {
      char* out = reinterpret_cast<char*>(p->bf16_.data() + bf16_at);
      EncodeBf16(grads[k].second, static_cast<size_t>(t.layout.num_elems()),
                 out);
      source = out;
      bf16_at += t.layout.num_elems();
    }
    auto it = read.versions.find(t.spec.name());
    const std::vector<uint64_t>* versions =
        it == read.versions.end() ? nullptr : &it->second;
    // Runs of neighbouring slices bound for the same shard travel as one
    // piece of the caller's memory.
    const char* run_begin = nullptr;
    size_t run_bytes = 0;
    int run_home = -1;
    auto flush = [&] {
      if (run_bytes == 0) return;
      payloads[run_home].emplace_back(const_cast<char*>(run_begin), run_bytes,
                                      &Borrowed::Release, borrowed);
      ++handed_over;
      run_bytes = 0;
    };
    for (uint32_t i = 0; i < t.layout.num_slices(); ++i) {
      const int home = t.home[i];
      SliceGradient* g = headers[home].add_grads();
      g->set_tensor(t.spec.name());
      g->set_slice(i);
      g->set_read_version(
          versions != nullptr && i < versions->size() ? (*versions)[i] : 0);
      const size_t bytes =
          static_cast<size_t>(t.layout.SliceSize(i)) * WireBytes(dtype);
      g->set_grad_bytes(bytes);
      const char* begin = source + t.layout.SliceBegin(i) * WireBytes(dtype);
      if (home == run_home && run_begin + run_bytes == begin) {
        run_bytes += bytes;
      } else {
        flush();
        run_begin = begin;
        run_bytes = bytes;
        run_home = home;
      }
    }
    flush();
  }
  {
    absl::MutexLock l(&borrowed->mu);
    borrowed->refs = handed_over;
  }

  const uint32_t connection = next_connection_++;
  std::vector<FanOut::Call> calls;
  for (int s = 0; s < n; ++s) {
    auto ps = std::make_unique<PushShard>();
    ps->shard = s;
    ps->frame = MakeFrame(headers[s], payloads[s]);
    PushShard* raw = ps.get();
    DataStream* stream =
        shards_[s]->pushes[connection % shards_[s]->pushes.size()].get();
    const uint64_t id = headers[s].request_id();
    FanOut::Call call;
    call.shard = s;
    call.start = [raw, stream, id](grpc::ClientContext*, FanOut::Done done) {
      stream->Send(id, raw->frame,
                   [raw, done = std::move(done)](absl::Status st,
                                                 grpc::ByteBuffer* answer) {
                     if (st.ok()) st = ReadPushAnswer(*answer, &raw->response);
                     done(st);
                   });
    };
    call.cancel = [stream] { stream->Cancel(); };
    calls.push_back(std::move(call));
    p->shards_.push_back(std::move(ps));
  }
  // The frames hold the only references to the payload slices now.
  payloads.clear();
  auto fanout = std::make_unique<FanOut>(Env(), "Push", CallPolicy());
  fanout->Start(std::move(calls));
  PendingPush* raw_call = p.get();
  p->call_.Start(std::move(fanout),
                 [raw_call](absl::Status s) { return raw_call->Finish(s); });
  return p;
}

absl::StatusOr<PushSummary> PsClient::Push(
    int64_t clock,
    const std::vector<std::pair<std::string, const float*>>& grads) {
  ReadSet read;
  {
    absl::MutexLock l(&mu_);
    read = last_read_;
  }
  return StartPush(clock, grads, read)->Wait();
}

std::vector<PushRequest> PsClient::PushHeaders(
    int64_t clock, uint64_t seq, const std::vector<uint64_t>& epochs) {
  std::vector<PushRequest> headers(num_shards());
  for (size_t s = 0; s < headers.size(); ++s) {
    *headers[s].mutable_worker() = MakeWorkerRef(clock);
    headers[s].set_seq(seq);
    headers[s].set_request_id(next_request_id_++);
    headers[s].set_wire_dtype(options_.push_dtype);
    if (s < epochs.size()) headers[s].set_read_epoch(epochs[s]);
  }
  return headers;
}

absl::Status ReadPushAnswer(const grpc::ByteBuffer& answer,
                            PushResponse* response) {
  response->Clear();
  absl::Status st = ParseFromByteBuffer(answer, response);
  if (!st.ok()) return absl::InternalError(st.message());
  return FromCallStatus(response->status());
}

void IssueCreateTensor(ParameterServer::Stub* stub, grpc::ClientContext* ctx,
                       const CreateTensorRequest* request,
                       CreateTensorResponse* response,
                       std::function<void(grpc::Status)> done) {
  stub->async()->CreateTensor(ctx, request, response, std::move(done));
}

// ---------------------------------------------------------------- other

absl::Status PsClient::Heartbeat(int64_t clock, bool leaving) {
  if (absl::Status s = CheckNotReader("Heartbeat"); !s.ok()) return s;
  HeartbeatRequest request;
  *request.mutable_worker() = MakeWorkerRef(clock);
  request.set_leaving(leaving);
  request.set_run_id(options_.run_id);
  std::vector<HeartbeatResponse> responses;
  return ToAllShards("Heartbeat", request, &responses, IssueHeartbeat, nullptr,
                     CallPolicy());
}

absl::StatusOr<ListTensorsResponse> PsClient::ListTensors() {
  const ListTensorsRequest request;
  std::vector<ListTensorsResponse> responses;
  absl::Status status = ToAllShards(
      "ListTensors", request, &responses,
      [](ParameterServer::Stub* stub, grpc::ClientContext* ctx,
         const ListTensorsRequest* req, ListTensorsResponse* resp,
         std::function<void(grpc::Status)> done) {
        stub->async()->ListTensors(ctx, req, resp, std::move(done));
      },
      nullptr, CallPolicy());
  if (!status.ok()) return status;
  // What every shard holds.
  absl::flat_hash_map<std::string, int> tensors, tables;
  for (const ListTensorsResponse& r : responses) {
    for (const TensorSpec& t : r.tensors()) ++tensors[t.name()];
    for (const TableSpec& t : r.tables()) ++tables[t.name()];
  }
  ListTensorsResponse out;
  out.set_run_id(responses[0].run_id());
  for (const TensorSpec& t : responses[0].tensors()) {
    if (tensors[t.name()] == num_shards()) *out.add_tensors() = t;
  }
  for (const TableSpec& t : responses[0].tables()) {
    if (tables[t.name()] == num_shards()) *out.add_tables() = t;
  }
  return out;
}

absl::StatusOr<std::vector<LearningRate>> PsClient::SetLearningRates(
    const std::vector<LearningRate>& rates) {
  SetLearningRateRequest request;
  for (const LearningRate& r : rates) *request.add_rates() = r;
  std::vector<SetLearningRateResponse> responses;
  absl::Status status = ToAllShards(
      "SetLearningRate", request, &responses,
      [](ParameterServer::Stub* stub, grpc::ClientContext* ctx,
         const SetLearningRateRequest* req, SetLearningRateResponse* resp,
         std::function<void(grpc::Status)> done) {
        stub->async()->SetLearningRate(ctx, req, resp, std::move(done));
      },
      nullptr, CallPolicy());
  if (!status.ok()) return status;
  std::vector<LearningRate> out = rates;
  for (const SetLearningRateResponse& r : responses) {
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
      "Status", request, &responses,
      [](ParameterServer::Stub* stub, grpc::ClientContext* ctx,
         const StatusRequest* req, StatusResponse* resp,
         std::function<void(grpc::Status)> done) {
        stub->async()->Status(ctx, req, resp, std::move(done));
      },
      nullptr, CallPolicy());
  if (!status.ok()) return status;
  return responses;
}

}  // namespace asyncps
