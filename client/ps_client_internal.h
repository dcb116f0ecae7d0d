#ifndef ASYNCPS_CLIENT_PS_CLIENT_INTERNAL_H_
#define ASYNCPS_CLIENT_PS_CLIENT_INTERNAL_H_

// Parts of PsClient shared by its source files (ps_client.cc: set-up and
// control calls; catalog.cc: tensors and tables known; pull.cc, push.cc,
// step.cc: the data path). Not for other users.

#include <google/protobuf/util/message_differencer.h>

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/data_stream.h"
#include "client/fanout.h"
#include "client/ps_client.h"
#include "common/grpc_status.h"
#include "common/names.h"
#include "common/shard_map_proto.h"
#include "proto/asyncps.grpc.pb.h"

namespace asyncps {

// The channels to one address of a shard. Const once opened.
struct PsClient::Endpoint {
  std::string address;
  std::shared_ptr<grpc::Channel> channel;       // connection 0
  std::unique_ptr<ParameterServer::Stub> stub;  // unary calls, connection 0
  // One pull, one push and one step stream per connection.
  std::vector<std::unique_ptr<DataStream>> pulls, pushes, steps;
};

// One shard's part of a pull: the request, where its slices and rows go,
// and what the answer said. Written by the answer's thread while the
// attempt runs, read by the waiting thread once it ended.
struct PsClient::PullShard {
  int shard = 0;
  PullRequest request;
  // Tensor name -> (its state, the caller's buffer), for the tensors asked.
  absl::flat_hash_map<std::string, std::pair<const TensorState*, float*>>
      targets;
  uint32_t slices = 0;  // expected in the answer
  // Per entry k of request.rows: its table's query, and the distinct-id
  // index of each of its ids.
  std::vector<RowsQueryState*> queries;
  std::vector<std::vector<uint32_t>> uniques;
  // Of the last successful answer:
  absl::flat_hash_map<std::string, std::vector<std::pair<uint32_t, uint64_t>>>
      versions;  // tensor -> (slice, version)
  uint64_t epoch = 0;
  uint64_t rows_created = 0;  // summed over its tables
  // Set when the shard refused the part for the map it was routed with:
  // the shard's map (nothing was read).
  std::optional<ShardMapProto> refused;
  bool tried = false;  // an attempt was made: the next is a retry
  std::atomic<DataStream*> stream{nullptr};  // of the attempt in flight
  // A step's pull (StartStep): the first attempt goes with the push part
  // held there for this shard, if any.
  std::shared_ptr<StepPairing> pairing;
};

// One shard's part of a push (client/push.cc).
struct PsClient::PushShard {
  int shard = 0;
  // The frame's header and payload, kept to split the part again when the
  // shard refuses it for its map.
  PushRequest header;
  std::vector<grpc::Slice> payload;
  grpc::ByteBuffer frame;  // built once (FrameOf), sent by every attempt
  PushResponse response;   // of the successful attempt
  // Set when the shard refused the part for the map it was routed with:
  // the shard's map (nothing was applied).
  std::optional<ShardMapProto> refused;
  // Set when the part was sent (it may have been applied there) and its
  // attempt failed, and a newer map gives the shard no slot (psctl scale
  // drained it; it may be stopped): that map. The part goes to the new
  // owners naming this shard and its seq (PushRequest.moved_from), which
  // apply it unless this shard had.
  std::optional<ShardMapProto> moved;
  std::atomic<DataStream*> stream{nullptr};  // of the attempt in flight
  // An attempt was handed to a stream: the part may have been applied, so
  // only the shard may refuse it from then on (its de-duplication first).
  bool sent = false;
  // A step's push (StartStep): the first attempt waits here for the pull.
  std::shared_ptr<StepPairing> pairing;
};

// Where a step's push and pull (StartStep) meet: each shard's push part,
// on its first attempt, leaves its frame here instead of sending it; the
// pull part to the same shard takes it and sends both as one StepStream
// request. Parts that find no partner go apart: the push parts left once
// the pull started are sent on their own (Close). Retries always go apart.
// Thread-safe.
class PsClient::StepPairing {
 public:
  // A push part's first attempt, held.
  struct Held {
    PushShard* part = nullptr;
    DataStream* alone = nullptr;  // the push stream it would have gone on
    DataStream::Done answered;    // the push attempt's answer callback
  };

  // Holds a push part's attempt (true), or leaves it to be sent now
  // (false: the pairing is closed). *answered is moved from only when held.
  bool Hold(int shard, PushShard* part, DataStream* alone,
            DataStream::Done* answered) {
    absl::MutexLock l(&mu_);
    if (closed_) return false;
    held_[shard] = Held{part, alone, std::move(*answered)};
    return true;
  }

  // The push part held for `shard`, taken (part null: none).
  Held Take(int shard) {
    absl::MutexLock l(&mu_);
    auto it = held_.find(shard);
    if (it == held_.end()) return Held{};
    Held h = std::move(it->second);
    held_.erase(it);
    return h;
  }

  // Holds nothing more; returns the parts no pull took, to send apart.
  std::vector<Held> Close() {
    absl::MutexLock l(&mu_);
    closed_ = true;
    std::vector<Held> left;
    for (auto& [shard, h] : held_) left.push_back(std::move(h));
    held_.clear();
    return left;
  }

 private:
  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<int, Held> held_ ABSL_GUARDED_BY(mu_);  // by shard
};

// One shard: the endpoint in use. An endpoint replaced (the shard's
// primary moved) stays open until the client goes (PsClient::endpoints_):
// attempts in flight on it may still run, and nothing is deleted on gRPC's
// threads; they fail there and are retried on the new one.
struct PsClient::Shard {
  // Null while no address is known (a router that names none yet).
  std::atomic<Endpoint*> current{nullptr};
};

// A stream answer's CallStatus as an absl::Status; the map of a refusal
// for an older map rides along (RefusalMap, common/shard_map_proto.h), and
// the epoch a shard behind the request's map serves (ServedMapEpoch).
inline absl::Status FromCallStatus(const CallStatus& s) {
  if (s.code() == 0) return absl::OkStatus();
  absl::Status status(static_cast<absl::StatusCode>(s.code()), s.message());
  if (s.has_map()) return WithRefusalMap(std::move(status), s.map());
  if (s.served_map_epoch() != 0) {
    return WithServedMapEpoch(std::move(status), s.served_map_epoch());
  }
  return status;
}

// Parses a PushStream answer into `response` and returns its status.
absl::Status ReadPushAnswer(const grpc::ByteBuffer& answer,
                            PushResponse* response);

// Prepares one CreateTensor attempt (for ToAllShards).
std::unique_ptr<grpc::ClientAsyncResponseReader<CreateTensorResponse>>
PrepareCreateTensor(ParameterServer::Stub* stub, grpc::ClientContext* ctx,
                    const CreateTensorRequest& request,
                    grpc::CompletionQueue* cq);

// Adds `state` to `known` under its spec's name, unless the name is known:
// then OK when the spec is the same, FAILED_PRECONDITION (naming `kind`)
// when the shards changed it. The caller holds the lock guarding `known`.
template <typename State>
absl::Status RememberOnce(
    absl::flat_hash_map<std::string, std::unique_ptr<State>>* known,
    std::unique_ptr<State> state, absl::string_view kind) {
  const std::string name = state->spec.name();
  auto it = known->find(name);
  if (it == known->end()) {
    known->emplace(name, std::move(state));
    return absl::OkStatus();
  }
  if (google::protobuf::util::MessageDifferencer::Equals(it->second->spec,
                                                         state->spec)) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      kind, " ", QuoteName(name), " changed its spec on the shards: was {",
      it->second->spec.ShortDebugString(), "}, now {",
      state->spec.ShortDebugString(), "}"));
}

// Unary RPC to every shard through one FanOut (see ps_client.h).
template <typename Request, typename Response, typename Prepare>
absl::Status PsClient::ToAllShards(const std::vector<int>& shards,
                                   const char* method, const Request& request,
                                   std::vector<Response>* responses,
                                   Prepare prepare,
                                   std::function<absl::Status(int)> on_ok,
                                   const RetryPolicy& policy) {
  responses->assign(num_shards(), Response());
  std::vector<FanOut::Call> calls;
  for (const int s : shards) {
    FanOut::Call call;
    call.shard = s;
    call.start = [this, s, &request, responses, prepare](
                     grpc::ClientContext* ctx, FanOut::Done done) {
      (*responses)[s].Clear();
      Endpoint* endpoint = EndpointOf(s);
      if (endpoint == nullptr) return done(NoAddress(s));
      queue_.StartUnary(
          prepare(endpoint->stub.get(), ctx, request, queue_.cq()),
          &(*responses)[s], [done = std::move(done)](grpc::Status st) {
            done(FromGrpcStatus(st));
          });
    };
    if (on_ok) call.on_ok = [s, on_ok] { return on_ok(s); };
    calls.push_back(std::move(call));
  }
  FanOut fanout(Env(), method, policy);
  fanout.Start(std::move(calls));
  return fanout.Wait();
}

}  // namespace asyncps

#endif  // ASYNCPS_CLIENT_PS_CLIENT_INTERNAL_H_
