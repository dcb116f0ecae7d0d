#include "worker/ps_client.h"

#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/generic/generic_stub.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/fast_frame.h"
#include "common/float_codec.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/sharding.h"

namespace asyncps {

namespace {

constexpr absl::Duration kMaxBackoff = absl::Seconds(5);
constexpr absl::Duration kMaxListPollInterval = absl::Seconds(1);

bool IsRetriable(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE ||
         code == grpc::StatusCode::DEADLINE_EXCEEDED;
}

absl::Status Annotate(const absl::Status& s, absl::string_view prefix) {
  return absl::Status(s.code(), absl::StrCat(prefix, ": ", s.message()));
}

}  // namespace

struct PsClient::Shard {
  std::string address;
  std::unique_ptr<ParameterServer::Stub> stub;
  // PullFast / PushFast, on the same channel.
  std::unique_ptr<grpc::GenericStub> generic;
};

// One shard's part of a FanOut.
struct PsClient::FanOutCall {
  int shard;
  // Starts one attempt: issues the RPC on `ctx` with `done` as completion.
  // Must clear the response message first (it may hold a failed attempt's).
  std::function<void(grpc::ClientContext* ctx,
                     std::function<void(grpc::Status)> done)>
      start;
  std::function<absl::Status()> on_ok;  // after a successful attempt
};

// Runs one RPC per participating shard concurrently and waits for all of
// them, retrying UNAVAILABLE / DEADLINE_EXCEEDED with backoff. Everything but
// recording completions happens in the calling thread, including the
// per-shard `on_ok` handlers, which therefore need no locking. After the
// first final failure the other calls are cancelled and not retried; Run()
// still waits for every callback, so requests and responses owned by the
// caller may be destroyed once it returns.
class PsClient::FanOut {
 public:
  using Call = FanOutCall;

  FanOut(PsClient* client, absl::string_view method, int max_attempts,
         absl::Time deadline = absl::InfiniteFuture())
      : client_(client),
        method_(method),
        max_attempts_(max_attempts),
        deadline_(deadline) {}

  absl::Status Run(std::vector<Call> calls) {
    const int n = static_cast<int>(calls.size());
    auto completions = std::make_shared<Completions>(n);
    std::vector<Slot> slots(n);
    absl::Status first_error;
    int unfinished = n;

    auto fail = [&](int i, const absl::Status& s) {
      if (!first_error.ok()) return;
      first_error = Annotate(
          s, absl::StrCat(method_, " on ", client_->ShardName(calls[i].shard)));
      for (Slot& slot : slots) {
        if (slot.in_flight) slot.ctx->TryCancel();
      }
    };

    while (unfinished > 0) {
      const absl::Time now = absl::Now();
      absl::Time wake = absl::InfiniteFuture();
      for (int i = 0; i < n; ++i) {
        Slot& slot = slots[i];
        if (slot.finished || slot.in_flight) continue;
        if (!first_error.ok()) {  // a retry that is no longer wanted
          slot.finished = true;
          --unfinished;
          continue;
        }
        if (slot.next_start > now) {
          wake = std::min(wake, slot.next_start);
          continue;
        }
        ++slot.attempts;
        slot.in_flight = true;
        slot.ctx = std::make_unique<grpc::ClientContext>();
        slot.ctx->set_deadline(absl::ToChronoTime(
            std::min(now + client_->options_.rpc_timeout, deadline_)));
        calls[i].start(slot.ctx.get(), [completions, i](grpc::Status s) {
          absl::MutexLock lock(&completions->mu);
          completions->status[i] = std::move(s);
          completions->done.push_back(i);
          completions->cv.Signal();
        });
      }
      if (unfinished == 0) break;

      std::vector<std::pair<int, grpc::Status>> done;
      {
        absl::MutexLock lock(&completions->mu);
        while (completions->done.empty() &&
               !completions->cv.WaitWithDeadline(&completions->mu, wake)) {
        }
        for (int i : completions->done) {
          done.emplace_back(i, std::move(completions->status[i]));
        }
        completions->done.clear();
      }

      for (auto& [i, status] : done) {
        Slot& slot = slots[i];
        slot.in_flight = false;
        if (status.ok()) {
          slot.finished = true;
          --unfinished;
          if (first_error.ok()) {
            absl::Status s = calls[i].on_ok();
            if (!s.ok()) fail(i, s);
          }
          continue;
        }
        const absl::Time t = absl::Now();
        if (first_error.ok() && IsRetriable(status.error_code()) &&
            slot.attempts < max_attempts_ && t < deadline_) {
          const absl::Duration backoff = Backoff(slot.attempts);
          client_->options_.logger->debug(
              "{} on {} failed (attempt {}/{}): {}; retrying in {}", method_,
              client_->ShardName(calls[i].shard), slot.attempts, max_attempts_,
              status.error_message(), absl::FormatDuration(backoff));
          slot.next_start = t + backoff;
          continue;
        }
        slot.finished = true;
        --unfinished;
        if (first_error.ok()) {
          absl::Status s = FromGrpcStatus(status);
          if (slot.attempts > 1) {
            s = Annotate(s, absl::StrCat("after ", slot.attempts, " attempts"));
          }
          fail(i, s);
        }
      }
    }
    return first_error;
  }

 private:
  struct Completions {
    explicit Completions(int n) : status(n) {}
    absl::Mutex mu;
    absl::CondVar cv;
    std::vector<grpc::Status> status ABSL_GUARDED_BY(mu);
    std::vector<int> done ABSL_GUARDED_BY(mu);  // indices, in completion order
  };
  struct Slot {
    int attempts = 0;
    bool in_flight = false;
    bool finished = false;
    absl::Time next_start = absl::InfinitePast();
    std::unique_ptr<grpc::ClientContext> ctx;
  };

  absl::Duration Backoff(int attempts) {
    absl::Duration d = client_->options_.initial_backoff;
    for (int k = 1; k < attempts && d < kMaxBackoff; ++k) d *= 2;
    d = std::min(d, kMaxBackoff);
    return d * absl::Uniform(client_->rng_, 0.8, 1.2);
  }

  PsClient* const client_;  // Not owned.
  const std::string method_;
  const int max_attempts_;
  const absl::Time deadline_;
};

template <typename Request, typename Response, typename Issue>
std::vector<PsClient::FanOutCall> PsClient::ToAllShards(
    const Request& request, std::vector<Response>* responses, Issue issue,
    std::function<absl::Status(int)> on_ok) {
  const int n = num_shards();
  responses->assign(n, Response());
  std::vector<FanOutCall> calls;
  for (int s = 0; s < n; ++s) {
    FanOutCall call;
    call.shard = s;
    call.start = [this, s, &request, responses, issue](
                     grpc::ClientContext* ctx,
                     std::function<void(grpc::Status)> done) {
      (*responses)[s].Clear();
      issue(shards_[s]->stub.get(), ctx, &request, &(*responses)[s],
            std::move(done));
    };
    call.on_ok = [s, on_ok]() { return on_ok ? on_ok(s) : absl::OkStatus(); };
    calls.push_back(std::move(call));
  }
  return calls;
}

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
  if (options.max_attempts < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PsClient: max_attempts must be >= 1, got ", options.max_attempts));
  }
  if (options.rpc_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("PsClient: rpc_timeout must be > 0");
  }
  if (options.initial_backoff < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("PsClient: initial_backoff must be >= 0");
  }
  if (absl::Status s = ChannelCredentials(options.security).status();
      !s.ok()) {
    return s;
  }
  if (options.logger == nullptr) options.logger = NullLogger();
  if (options.incarnation == 0) {
    absl::BitGen gen;
    options.incarnation = absl::Uniform<uint64_t>(
        absl::IntervalClosed, gen, 1, std::numeric_limits<uint64_t>::max());
  }
  std::unique_ptr<PsClient> client(new PsClient(std::move(options)));
  for (const std::string& address : client->options_.servers) {
    auto shard = std::make_unique<Shard>();
    shard->address = address;
    std::shared_ptr<grpc::Channel> channel = MakeChannel(address, 0, client->options_.security);
    shard->stub = ParameterServer::NewStub(channel);
    shard->generic = std::make_unique<grpc::GenericStub>(channel);
    client->shards_.push_back(std::move(shard));
  }
  return client;
}

std::string PsClient::ShardName(int shard) const {
  return absl::StrCat("shard ", shard, " (", shards_[shard]->address, ")");
}

WorkerRef PsClient::MakeWorkerRef(int64_t clock) const {
  WorkerRef ref;
  ref.set_worker_id(options_.worker_id);
  ref.set_incarnation(options_.incarnation);
  ref.set_clock(clock);
  return ref;
}

const TensorSpec* PsClient::FindSpec(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second.spec;
}

std::vector<uint64_t> PsClient::PulledVersions(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? std::vector<uint64_t>()
                              : it->second.read_versions;
}

absl::Status PsClient::Remember(const TensorSpec& spec) {
  absl::StatusOr<TensorLayout> layout = TensorLayout::FromSpec(spec);
  if (!layout.ok()) {
    return Annotate(layout.status(),
                    absl::StrCat("tensor '", spec.name(), "'"));
  }
  const int n = num_shards();
  TensorState state{spec, *layout, {}, std::vector<uint32_t>(n, 0), {}};
  state.home.resize(layout->num_slices());
  state.read_versions.assign(layout->num_slices(), 0);
  for (uint32_t i = 0; i < layout->num_slices(); ++i) {
    state.home[i] = SliceHome(spec.name(), i, n);
    ++state.slices_on[state.home[i]];
  }
  auto it = tensors_.find(spec.name());
  if (it != tensors_.end() &&
      google::protobuf::util::MessageDifferencer::Equals(it->second.spec,
                                                         spec)) {
    return absl::OkStatus();  // keep the versions read so far
  }
  tensors_.insert_or_assign(spec.name(), std::move(state));
  return absl::OkStatus();
}

absl::Status PsClient::CreateTensors(const std::vector<TensorSpec>& specs) {
  absl::flat_hash_set<std::string> names;
  for (const TensorSpec& spec : specs) {
    if (spec.name().empty()) {
      return absl::InvalidArgumentError("CreateTensors: a tensor has no name");
    }
    if (!names.insert(spec.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CreateTensors: tensor '", spec.name(), "' given twice"));
    }
    if (spec.slice_elems() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CreateTensors: tensor '", spec.name(),
          "': slice_elems must be >= 0, got ", spec.slice_elems()));
    }
    absl::StatusOr<TensorLayout> layout = TensorLayout::Create(
        std::vector<int64_t>(spec.shape().begin(), spec.shape().end()), 1);
    if (!layout.ok()) {
      return Annotate(layout.status(), absl::StrCat("CreateTensors: tensor '",
                                                    spec.name(), "'"));
    }
  }
  if (specs.empty()) return absl::OkStatus();

  const int n = num_shards();
  CreateTensorRequest request;
  for (const TensorSpec& spec : specs) *request.add_tensors() = spec;
  std::vector<CreateTensorResponse> responses;
  std::vector<FanOutCall> calls = ToAllShards(
      request, &responses,
      [](ParameterServer::Stub* stub, grpc::ClientContext* ctx,
         const CreateTensorRequest* req, CreateTensorResponse* resp,
         std::function<void(grpc::Status)> done) {
        stub->async()->CreateTensor(ctx, req, resp, std::move(done));
      },
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
            return absl::InternalError(
                absl::StrCat("answered spec {", got.ShortDebugString(),
                             "} for requested tensor '", specs[k].name(), "'"));
          }
        }
        return absl::OkStatus();
      });
  absl::Status status =
      FanOut(this, "CreateTensor", options_.max_attempts).Run(std::move(calls));
  if (!status.ok()) return status;

  for (size_t k = 0; k < specs.size(); ++k) {
    const TensorSpec& first = responses[0].tensors(static_cast<int>(k));
    for (int s = 1; s < n; ++s) {
      const TensorSpec& other = responses[s].tensors(static_cast<int>(k));
      if (other.slice_elems() != first.slice_elems()) {
        return absl::FailedPreconditionError(
            absl::StrCat("tensor '", first.name(), "': ", ShardName(0),
                         " resolved slice_elems=", first.slice_elems(), " but ",
                         ShardName(s), " resolved ", other.slice_elems(),
                         "; start every shard with the same --slice_elems"));
      }
      if (!google::protobuf::util::MessageDifferencer::Equals(first, other)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "tensor '", first.name(), "' differs between shards: ",
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
  const absl::Time deadline = absl::Now() + timeout;
  const int n = num_shards();
  absl::Duration interval = options_.initial_backoff;
  std::string missing = "no shard answered";
  std::string last_error;
  while (true) {
    std::vector<ListTensorsResponse> responses;
    std::vector<std::string> unreachable;  // transient errors this round
    const ListTensorsRequest request;
    // One attempt per shard per round: polling is the retry.
    std::vector<FanOutCall> calls = ToAllShards(
        request, &responses,
        [](ParameterServer::Stub* stub, grpc::ClientContext* ctx,
           const ListTensorsRequest* req, ListTensorsResponse* resp,
           std::function<void(grpc::Status)> done) {
          stub->async()->ListTensors(ctx, req, resp, std::move(done));
        });
    absl::Status status =
        FanOut(this, "ListTensors", /*max_attempts=*/1, deadline)
            .Run(std::move(calls));
    if (!status.ok() && !absl::IsUnavailable(status) &&
        !absl::IsDeadlineExceeded(status) && !absl::IsCancelled(status)) {
      return status;
    }
    if (status.ok()) {
      std::vector<absl::flat_hash_map<std::string, const TensorSpec*>> held(n);
      for (int s = 0; s < n; ++s) {
        for (const TensorSpec& spec : responses[s].tensors()) {
          held[s][spec.name()] = &spec;
        }
      }
      std::vector<std::string> absent;
      for (const std::string& name : names) {
        for (int s = 0; s < n; ++s) {
          if (!held[s].contains(name)) {
            absent.push_back(absl::StrCat("'", name, "' on ", ShardName(s)));
          }
        }
      }
      if (absent.empty()) {
        for (const std::string& name : names) {
          const TensorSpec& first = *held[0][name];
          for (int s = 1; s < n; ++s) {
            if (!google::protobuf::util::MessageDifferencer::Equals(
                    first, *held[s][name])) {
              return absl::FailedPreconditionError(absl::StrCat(
                  "tensor '", name, "' differs between shards: ", ShardName(0),
                  " holds {", first.ShortDebugString(), "}, ", ShardName(s),
                  " holds {", held[s][name]->ShortDebugString(), "}"));
            }
          }
        }
        for (const std::string& name : names) {
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
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "tensors [", absl::StrJoin(names, ", "),
          "] not on every shard after ", absl::FormatDuration(timeout), "; ",
          missing, last_error));
    }
    absl::SleepFor(std::min(interval, deadline - now));
    interval = std::min(interval * 2, kMaxListPollInterval);
  }
}

absl::Status PsClient::Pull(
    int64_t clock, const std::vector<std::pair<std::string, float*>>& outs) {
  // Validate everything before sending anything.
  absl::flat_hash_map<std::string, std::pair<TensorState*, float*>> wanted;
  for (const auto& [name, buffer] : outs) {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) {
      return absl::NotFoundError(
          absl::StrCat("Pull: unknown tensor '", name,
                       "' (create it or wait for it before pulling)"));
    }
    if (buffer == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("Pull: null buffer for tensor '", name, "'"));
    }
    if (!wanted.try_emplace(name, &it->second, buffer).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("Pull: tensor '", name, "' requested twice"));
    }
  }
  if (outs.empty()) return absl::OkStatus();

  const int n = num_shards();
  const bool fast = options_.fast_path;
  std::vector<PullRequest> requests(n);
  std::vector<PullResponse> responses(n);
  // Fast path: the serialized requests and the answered frames.
  std::vector<grpc::ByteBuffer> raw_requests(n), raw_responses(n);
  // Versions and arrivals staged here; committed only if the whole pull works.
  absl::flat_hash_map<std::string, std::vector<uint64_t>> versions;
  absl::flat_hash_map<std::string, std::vector<bool>> arrived;
  std::vector<FanOut::Call> calls;
  for (int s = 0; s < n; ++s) {
    for (const auto& [name, buffer] : outs) {
      if (wanted[name].first->slices_on[s] > 0) requests[s].add_tensors(name);
    }
    if (requests[s].tensors_size() == 0) continue;
    *requests[s].mutable_worker() = MakeWorkerRef(clock);
    if (fast) raw_requests[s] = SerializeToByteBuffer(requests[s]);
    calls.push_back(FanOut::Call{
        s,
        [this, s, fast, &requests, &responses, &raw_requests, &raw_responses](
            grpc::ClientContext* ctx, std::function<void(grpc::Status)> done) {
          responses[s].Clear();
          if (fast) {
            raw_responses[s].Clear();
            shards_[s]->generic->UnaryCall(
                ctx, kPullFastMethod, grpc::StubOptions(), &raw_requests[s],
                &raw_responses[s], std::move(done));
          } else {
            shards_[s]->stub->async()->Pull(ctx, &requests[s], &responses[s],
                                            std::move(done));
          }
        },
        [s, fast, &requests, &responses, &raw_responses, &wanted, &versions,
         &arrived]() -> absl::Status {
          // Fast path: the header gives the slices, the payload follows.
          FrameReader frame;
          if (fast) {
            const absl::Status st = frame.Open(raw_responses[s], &responses[s]);
            if (!st.ok()) return absl::InternalError(st.message());
          }
          absl::flat_hash_map<std::string, uint32_t> received;
          for (const SliceData& d : responses[s].slices()) {
            auto it = wanted.find(d.tensor());
            if (it == wanted.end()) {
              return absl::InternalError(
                  absl::StrCat("returned a slice of tensor '", d.tensor(),
                               "', which was not requested"));
            }
            const TensorState& t = *it->second.first;
            if (d.slice() >= t.layout.num_slices() || t.home[d.slice()] != s) {
              return absl::InternalError(
                  absl::StrCat("returned slice ", d.slice(), " of tensor '",
                               d.tensor(), "', which is not one of its ",
                               t.layout.num_slices(), " slices homed there"));
            }
            std::vector<bool>& seen = arrived[d.tensor()];
            seen.resize(t.layout.num_slices(), false);
            if (seen[d.slice()]) {
              return absl::InternalError(absl::StrCat("returned slice ",
                                                      d.slice(), " of tensor '",
                                                      d.tensor(), "' twice"));
            }
            const int64_t elems = t.layout.SliceSize(d.slice());
            const uint64_t bytes = fast ? d.payload_bytes() : d.values().size();
            if (bytes != static_cast<uint64_t>(elems) * sizeof(float)) {
              return absl::InternalError(absl::StrCat(
                  "returned ", bytes, " bytes for slice ", d.slice(),
                  " of tensor '", d.tensor(), "', expected ",
                  elems * static_cast<int64_t>(sizeof(float))));
            }
            float* dst = it->second.second + t.layout.SliceBegin(d.slice());
            if (fast) {
              const absl::Status st =
                  frame.CopyNext(bytes, reinterpret_cast<char*>(dst));
              if (!st.ok()) return absl::InternalError(st.message());
            } else {
              DecodeFloats(d.values(), dst, static_cast<size_t>(elems));
            }
            seen[d.slice()] = true;
            std::vector<uint64_t>& v = versions[d.tensor()];
            v.resize(t.layout.num_slices(), 0);
            v[d.slice()] = d.version();
            ++received[d.tensor()];
          }
          if (frame.remaining() != 0) {
            return absl::InternalError(absl::StrCat(
                "returned ", frame.remaining(), " bytes beyond its slices"));
          }
          for (const std::string& name : requests[s].tensors()) {
            const uint32_t expected = wanted.at(name).first->slices_on[s];
            if (received[name] != expected) {
              return absl::InternalError(absl::StrCat(
                  "returned ", received[name], " slices of tensor '", name,
                  "', expected ", expected));
            }
          }
          return absl::OkStatus();
        }});
  }
  absl::Status status =
      FanOut(this, "Pull", options_.max_attempts).Run(std::move(calls));
  if (!status.ok()) return status;
  for (auto& [name, v] : versions) {
    TensorState& t = *wanted.at(name).first;
    const std::vector<bool>& seen = arrived.at(name);
    for (uint32_t i = 0; i < t.layout.num_slices(); ++i) {
      if (seen[i]) t.read_versions[i] = v[i];
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PushSummary> PsClient::Push(
    int64_t clock,
    const std::vector<std::pair<std::string, const float*>>& grads) {
  std::vector<const TensorState*> states;
  absl::flat_hash_set<std::string> seen;
  for (const auto& [name, buffer] : grads) {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) {
      return absl::NotFoundError(
          absl::StrCat("Push: unknown tensor '", name,
                       "' (create it or wait for it before pushing)"));
    }
    if (buffer == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("Push: null gradient buffer for tensor '", name, "'"));
    }
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("Push: tensor '", name, "' given twice"));
    }
    states.push_back(&it->second);
  }

  // Every shard gets a request, so that each sees the clock; the sequence
  // number is shared by all of them and by their retries.
  const int n = num_shards();
  const uint64_t seq = next_seq_++;
  const bool fast = options_.fast_path;
  std::vector<PushRequest> requests(n);
  std::vector<PushResponse> responses(n);
  // Fast path: per shard, slices borrowing the caller's gradient buffers
  // (which the caller keeps unchanged until Push returns), then the frames
  // and the serialized answers.
  std::vector<std::vector<grpc::Slice>> payloads(n);
  std::vector<grpc::ByteBuffer> frames(n), raw_responses(n);
  for (int s = 0; s < n; ++s) {
    *requests[s].mutable_worker() = MakeWorkerRef(clock);
    requests[s].set_seq(seq);
  }
  for (size_t k = 0; k < grads.size(); ++k) {
    const TensorState& t = *states[k];
    for (uint32_t i = 0; i < t.layout.num_slices(); ++i) {
      const int home = t.home[i];
      SliceGradient* g = requests[home].add_grads();
      g->set_tensor(t.spec.name());
      g->set_slice(i);
      g->set_read_version(t.read_versions[i]);
      const float* begin = grads[k].second + t.layout.SliceBegin(i);
      const size_t elems = static_cast<size_t>(t.layout.SliceSize(i));
      if (!fast) {
        EncodeFloats(begin, elems, g->mutable_grad());
        continue;
      }
      const size_t bytes = elems * sizeof(float);
      g->set_grad_bytes(bytes);
      // Neighbouring slices bound for the same shard travel as one piece.
      std::vector<grpc::Slice>& out = payloads[home];
      if (!out.empty() &&
          out.back().end() == reinterpret_cast<const uint8_t*>(begin)) {
        out.back() =
            BorrowedSlice(out.back().begin(), out.back().size() + bytes);
      } else {
        out.push_back(BorrowedSlice(begin, bytes));
      }
    }
  }
  if (fast) {
    for (int s = 0; s < n; ++s) frames[s] = MakeFrame(requests[s], payloads[s]);
  }

  PushSummary summary;
  uint64_t staleness_sum = 0;
  int64_t results = 0;
  std::vector<FanOut::Call> calls;
  for (int s = 0; s < n; ++s) {
    calls.push_back(FanOut::Call{
        s,
        [this, s, fast, &requests, &responses, &frames, &raw_responses](
            grpc::ClientContext* ctx, std::function<void(grpc::Status)> done) {
          responses[s].Clear();
          if (fast) {
            raw_responses[s].Clear();
            shards_[s]->generic->UnaryCall(ctx, kPushFastMethod,
                                           grpc::StubOptions(), &frames[s],
                                           &raw_responses[s], std::move(done));
          } else {
            shards_[s]->stub->async()->Push(ctx, &requests[s], &responses[s],
                                            std::move(done));
          }
        },
        [s, fast, &responses, &raw_responses, &summary, &staleness_sum,
         &results]() {
          if (fast) {
            const absl::Status st =
                ParseFromByteBuffer(raw_responses[s], &responses[s]);
            if (!st.ok()) return absl::InternalError(st.message());
          }
          const PushResponse& r = responses[s];
          if (r.duplicate()) ++summary.duplicates;
          for (const SliceResult& res : r.results()) {
            if (res.outcome() == APPLIED) {
              ++summary.applied;
            } else if (res.outcome() == REFUSED_STALE) {
              ++summary.refused_stale;
            }
            summary.max_staleness =
                std::max(summary.max_staleness, res.staleness());
            staleness_sum += res.staleness();
            ++results;
          }
          return absl::OkStatus();
        }});
  }
  absl::Status status =
      FanOut(this, "Push", options_.max_attempts).Run(std::move(calls));
  if (!status.ok()) return status;
  if (results > 0) {
    summary.mean_staleness =
        static_cast<double>(staleness_sum) / static_cast<double>(results);
  }
  return summary;
}

absl::Status PsClient::Heartbeat(int64_t clock, bool leaving) {
  HeartbeatRequest request;
  *request.mutable_worker() = MakeWorkerRef(clock);
  request.set_leaving(leaving);
  std::vector<HeartbeatResponse> responses;
  std::vector<FanOutCall> calls =
      ToAllShards(request, &responses,
                  [](ParameterServer::Stub* stub, grpc::ClientContext* ctx,
                     const HeartbeatRequest* req, HeartbeatResponse* resp,
                     std::function<void(grpc::Status)> done) {
                    stub->async()->Heartbeat(ctx, req, resp, std::move(done));
                  });
  return FanOut(this, "Heartbeat", options_.max_attempts).Run(std::move(calls));
}

absl::StatusOr<std::vector<StatusResponse>> PsClient::Status() {
  const StatusRequest request;
  std::vector<StatusResponse> responses;
  std::vector<FanOutCall> calls =
      ToAllShards(request, &responses,
                  [](ParameterServer::Stub* stub, grpc::ClientContext* ctx,
                     const StatusRequest* req, StatusResponse* resp,
                     std::function<void(grpc::Status)> done) {
                    stub->async()->Status(ctx, req, resp, std::move(done));
                  });
  absl::Status status =
      FanOut(this, "Status", options_.max_attempts).Run(std::move(calls));
  if (!status.ok()) return status;
  return responses;
}

}  // namespace asyncps
