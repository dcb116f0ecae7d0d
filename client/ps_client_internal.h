#ifndef ASYNCPS_CLIENT_PS_CLIENT_INTERNAL_H_
#define ASYNCPS_CLIENT_PS_CLIENT_INTERNAL_H_

// Parts of PsClient shared by its source files (ps_client.cc: set-up and
// control calls; catalog.cc: tensors and tables known; pull.cc, push.cc:
// the data path). Not for other users.

#include <google/protobuf/util/message_differencer.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
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
  std::unique_ptr<ParameterServer::Stub> stub;  // unary calls, connection 0
  // One pull and one push stream per connection.
  std::vector<std::unique_ptr<DataStream>> pulls, pushes;
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
// for an older map rides along (RefusalMap, common/shard_map_proto.h).
inline absl::Status FromCallStatus(const CallStatus& s) {
  if (s.code() == 0) return absl::OkStatus();
  absl::Status status(static_cast<absl::StatusCode>(s.code()), s.message());
  if (s.has_map()) return WithRefusalMap(std::move(status), s.map());
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
