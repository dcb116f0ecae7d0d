#include "tools/shard_query.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "common/grpc_status.h"
#include "common/net.h"
#include "proto/grpc_health_v1.grpc.pb.h"

namespace asyncps {

namespace {

// Issues `call(stub, ctx, request, response, done)` on every shard at once
// and waits for all of them; each call has its own deadline, so the wait is
// bounded by `timeout` (plus scheduling).
template <typename Request, typename Response, typename Stub, typename Call>
std::vector<std::pair<grpc::Status, Response>> FanOut(
    const std::vector<std::unique_ptr<Stub>>& stubs, absl::Duration timeout,
    Call call) {
  const size_t n = stubs.size();
  std::vector<grpc::ClientContext> contexts(n);
  std::vector<Request> requests(n);
  std::vector<std::pair<grpc::Status, Response>> results(n);
  absl::BlockingCounter pending(static_cast<int>(n));
  const auto deadline = absl::ToChronoTime(absl::Now() + timeout);
  for (size_t i = 0; i < n; ++i) {
    contexts[i].set_deadline(deadline);
    call(stubs[i].get(), &contexts[i], &requests[i], &results[i].second,
         [&results, &pending, i](grpc::Status s) {
           results[i].first = std::move(s);
           pending.DecrementCount();
         });
  }
  pending.Wait();
  return results;
}

std::string ErrorText(const grpc::Status& s) {
  return FromGrpcStatus(s).ToString();
}

}  // namespace

ShardQuery::ShardQuery(std::vector<std::string> addresses,
                       const SecurityOptions& security)
    : addresses_(std::move(addresses)) {
  for (const std::string& a : addresses_) {
    channels_.push_back(MakeChannel(a, 0, security));
    stubs_.push_back(ParameterServer::NewStub(channels_.back()));
  }
}

ShardQuery::~ShardQuery() = default;

std::vector<ShardResult> ShardQuery::Status(absl::Duration timeout) {
  auto answers = FanOut<StatusRequest, StatusResponse>(
      stubs_, timeout,
      [](ParameterServer::Stub* stub, grpc::ClientContext* ctx,
         const StatusRequest* req, StatusResponse* resp,
         std::function<void(grpc::Status)> done) {
        stub->async()->Status(ctx, req, resp, std::move(done));
      });
  std::vector<ShardResult> out(addresses_.size());
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].index = static_cast<int>(i);
    out[i].address = addresses_[i];
    out[i].up = answers[i].first.ok();
    if (out[i].up) {
      out[i].status = std::move(answers[i].second);
    } else {
      out[i].error = ErrorText(answers[i].first);
    }
  }
  return out;
}

std::vector<TensorListResult> ShardQuery::ListTensors(absl::Duration timeout) {
  auto answers = FanOut<ListTensorsRequest, ListTensorsResponse>(
      stubs_, timeout,
      [](ParameterServer::Stub* stub, grpc::ClientContext* ctx,
         const ListTensorsRequest* req, ListTensorsResponse* resp,
         std::function<void(grpc::Status)> done) {
        stub->async()->ListTensors(ctx, req, resp, std::move(done));
      });
  std::vector<TensorListResult> out(addresses_.size());
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].index = static_cast<int>(i);
    out[i].address = addresses_[i];
    out[i].up = answers[i].first.ok();
    if (out[i].up) {
      out[i].tensors = std::move(answers[i].second);
    } else {
      out[i].error = ErrorText(answers[i].first);
    }
  }
  return out;
}

std::vector<CheckpointResult> ShardQuery::Checkpoint(absl::Duration timeout) {
  auto answers = FanOut<CheckpointRequest, CheckpointResponse>(
      stubs_, timeout,
      [](ParameterServer::Stub* stub, grpc::ClientContext* ctx,
         const CheckpointRequest* req, CheckpointResponse* resp,
         std::function<void(grpc::Status)> done) {
        stub->async()->Checkpoint(ctx, req, resp, std::move(done));
      });
  std::vector<CheckpointResult> out(addresses_.size());
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].index = static_cast<int>(i);
    out[i].address = addresses_[i];
    out[i].ok = answers[i].first.ok();
    if (out[i].ok) {
      out[i].checkpoint = std::move(*answers[i].second.mutable_checkpoint());
    } else {
      out[i].error = ErrorText(answers[i].first);
    }
  }
  return out;
}

std::vector<HealthResult> ShardQuery::Health(absl::Duration timeout,
                                             const std::string& service) {
  using grpc::health::v1::HealthCheckRequest;
  using grpc::health::v1::HealthCheckResponse;
  std::vector<std::unique_ptr<grpc::health::v1::Health::Stub>> stubs;
  for (const auto& channel : channels_) {
    stubs.push_back(grpc::health::v1::Health::NewStub(channel));
  }
  auto answers = FanOut<HealthCheckRequest, HealthCheckResponse>(
      stubs, timeout,
      [&service](grpc::health::v1::Health::Stub* stub, grpc::ClientContext* ctx,
                 HealthCheckRequest* req, HealthCheckResponse* resp,
                 std::function<void(grpc::Status)> done) {
        req->set_service(service);
        stub->async()->Check(ctx, req, resp, std::move(done));
      });
  std::vector<HealthResult> out(addresses_.size());
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].index = static_cast<int>(i);
    out[i].address = addresses_[i];
    out[i].answered = answers[i].first.ok();
    if (out[i].answered) {
      out[i].status =
          HealthCheckResponse::ServingStatus_Name(answers[i].second.status());
    } else {
      out[i].error = ErrorText(answers[i].first);
    }
  }
  return out;
}

}  // namespace asyncps
