#include "tools/shard_query.h"

#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/fanout.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/net.h"
#include "proto/grpc_health_v1.grpc.pb.h"

namespace asyncps {

namespace {

// A second attempt catches calls that die with their connection (a shard
// restarting, a connection dropped); a shard that is down fails both
// attempts at once (its channel is in backoff), so psctl still answers
// promptly.
constexpr int kAttempts = 2;

// One shard's answer: the final outcome and, when it failed, the error of
// its last attempt (what psctl shows, without the engine's annotations).
template <typename Response>
struct Answer {
  absl::Status status;
  std::string error;  // "CODE: message" when !status.ok()
  Response response;
};

// Starts one RPC attempt: issue(shard, ctx, response, done).
template <typename Response>
using Issue =
    std::function<void(int shard, grpc::ClientContext* ctx, Response* response,
                       std::function<void(grpc::Status)> done)>;

// Why a shard with no address is not asked: a run whose shard map is in
// etcd may declare groups that no process holds yet (room to grow onto).
constexpr char kNoProcess[] =
    "no process holds this shard group (the shard map names none)";

// Runs `issue` on every shard at once through a FanOut that lets every shard
// run to its own end, and waits for all of them. Every call, retries
// included, ends within `timeout`. A shard without an address fails
// UNAVAILABLE at once, unasked.
template <typename Response>
std::vector<Answer<Response>> Ask(const char* method,
                                  const std::vector<std::string>& addresses,
                                  absl::Duration timeout,
                                  const Issue<Response>& issue) {
  const int n = static_cast<int>(addresses.size());
  std::vector<Answer<Response>> answers(n);
  // Errors of the last attempt, written by attempts on gRPC's threads
  // before they report done (FanOut's lock orders them before WaitAll's
  // return).
  std::vector<absl::Status> last(n);
  std::vector<FanOut::Call> calls;
  std::vector<int> asked;  // the shard of each call
  for (int s = 0; s < n; ++s) {
    if (addresses[s].empty()) {
      answers[s].status = absl::UnavailableError(kNoProcess);
      answers[s].error = answers[s].status.ToString();
      continue;
    }
    asked.push_back(s);
    FanOut::Call call;
    call.shard = s;
    call.start = [s, &answers, &last, &issue](grpc::ClientContext* ctx,
                                              FanOut::Done done) {
      answers[s].response.Clear();
      issue(s, ctx, &answers[s].response,
            [s, &last, done = std::move(done)](grpc::Status st) {
              last[s] = FromGrpcStatus(st);
              done(last[s]);
            });
    };
    calls.push_back(std::move(call));
  }
  if (calls.empty()) return answers;
  FanOutEnv env;
  env.logger = NullLogger();  // psctl reports failures itself
  env.shard_name = [&addresses](int shard) {
    return absl::StrCat("shard ", shard, " (", addresses[shard], ")");
  };
  RetryPolicy policy;
  policy.call_deadline = timeout;
  policy.attempt_timeout = timeout;
  policy.initial_backoff = absl::Milliseconds(100);
  policy.max_backoff = absl::Milliseconds(100);
  policy.report_every = absl::InfiniteDuration();
  policy.max_attempts = kAttempts;
  FanOut fanout(std::move(env), method, policy, /*stop_on_error=*/false);
  fanout.Start(std::move(calls));
  const std::vector<absl::Status> results = fanout.WaitAll();
  for (size_t i = 0; i < asked.size(); ++i) {
    const int s = asked[i];
    answers[s].status = results[i];
    if (!results[i].ok()) {
      answers[s].error = (last[s].ok() ? results[i] : last[s]).ToString();
    }
  }
  return answers;
}

// One result per shard, in address order: index and address, then the
// answer's part through set(result, answer).
template <typename Result, typename Response, typename Set>
std::vector<Result> Collect(const std::vector<std::string>& addresses,
                            std::vector<Answer<Response>>& answers, Set set) {
  std::vector<Result> out(addresses.size());
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].index = static_cast<int>(i);
    out[i].address = addresses[i];
    set(out[i], answers[i]);
  }
  return out;
}

}  // namespace

ShardQuery::ShardQuery(std::vector<std::string> addresses,
                       const SecurityOptions& security)
    : addresses_(std::move(addresses)) {
  for (const std::string& a : addresses_) {
    // A group no process holds is never asked (Ask): no channel.
    channels_.push_back(a.empty() ? nullptr : MakeChannel(a, 0, security));
    stubs_.push_back(a.empty() ? nullptr
                               : ParameterServer::NewStub(channels_.back()));
  }
}

ShardQuery::~ShardQuery() = default;

std::vector<ShardResult> ShardQuery::Status(absl::Duration timeout,
                                            const StatusRequest& request) {
  auto answers = Ask<StatusResponse>(
      "Status", addresses_, timeout,
      [this, &request](int s, grpc::ClientContext* ctx, StatusResponse* resp,
                       std::function<void(grpc::Status)> done) {
        stubs_[s]->async()->Status(ctx, &request, resp, std::move(done));
      });
  return Collect<ShardResult>(addresses_, answers,
                              [](ShardResult& r, Answer<StatusResponse>& a) {
                                r.up = a.status.ok();
                                if (r.up) {
                                  r.status = std::move(a.response);
                                } else {
                                  r.error = a.error;
                                }
                              });
}

std::vector<TensorListResult> ShardQuery::ListTensors(absl::Duration timeout) {
  const ListTensorsRequest request;
  auto answers = Ask<ListTensorsResponse>(
      "ListTensors", addresses_, timeout,
      [this, &request](int s, grpc::ClientContext* ctx,
                       ListTensorsResponse* resp,
                       std::function<void(grpc::Status)> done) {
        stubs_[s]->async()->ListTensors(ctx, &request, resp, std::move(done));
      });
  return Collect<TensorListResult>(
      addresses_, answers,
      [](TensorListResult& r, Answer<ListTensorsResponse>& a) {
        r.up = a.status.ok();
        if (r.up) {
          r.tensors = std::move(a.response);
        } else {
          r.error = a.error;
        }
      });
}

std::vector<CheckpointResult> ShardQuery::Checkpoint(absl::Duration timeout) {
  const CheckpointRequest request;
  auto answers = Ask<CheckpointResponse>(
      "Checkpoint", addresses_, timeout,
      [this, &request](int s, grpc::ClientContext* ctx,
                       CheckpointResponse* resp,
                       std::function<void(grpc::Status)> done) {
        stubs_[s]->async()->Checkpoint(ctx, &request, resp, std::move(done));
      });
  return Collect<CheckpointResult>(
      addresses_, answers,
      [](CheckpointResult& r, Answer<CheckpointResponse>& a) {
        r.ok = a.status.ok();
        if (r.ok) {
          r.checkpoint = std::move(*a.response.mutable_checkpoint());
        } else {
          r.error = a.error;
        }
      });
}

std::vector<HealthResult> ShardQuery::Health(absl::Duration timeout,
                                             const std::string& service) {
  using grpc::health::v1::HealthCheckRequest;
  using grpc::health::v1::HealthCheckResponse;
  std::vector<std::unique_ptr<grpc::health::v1::Health::Stub>> stubs;
  for (const auto& channel : channels_) {
    stubs.push_back(channel == nullptr
                        ? nullptr
                        : grpc::health::v1::Health::NewStub(channel));
  }
  HealthCheckRequest request;
  request.set_service(service);
  auto answers = Ask<HealthCheckResponse>(
      "Check", addresses_, timeout,
      [&stubs, &request](int s, grpc::ClientContext* ctx,
                         HealthCheckResponse* resp,
                         std::function<void(grpc::Status)> done) {
        stubs[s]->async()->Check(ctx, &request, resp, std::move(done));
      });
  return Collect<HealthResult>(
      addresses_, answers, [](HealthResult& r, Answer<HealthCheckResponse>& a) {
        r.answered = a.status.ok();
        if (r.answered) {
          r.status =
              HealthCheckResponse::ServingStatus_Name(a.response.status());
        } else {
          r.error = a.error;
        }
      });
}

}  // namespace asyncps
