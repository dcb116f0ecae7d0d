#ifndef ASYNCPS_TESTS_MONITORING_SHARD_RPC_H_
#define ASYNCPS_TESTS_MONITORING_SHARD_RPC_H_

// Raw ParameterServer calls for monitoring tests: each builds one request,
// calls with a deadline and returns the gRPC status, so a test controls
// every counted event (which PsClient, with its retries and fan-out, would
// not).

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/net.h"
#include "proto/asyncps.grpc.pb.h"

namespace asyncps {
namespace testing {

inline constexpr absl::Duration kRpcDeadline = absl::Seconds(20);

// A shard at `address`, one stub, every call with kRpcDeadline.
class ShardRpc {
 public:
  explicit ShardRpc(const std::string& address)
      : stub_(ParameterServer::NewStub(MakeChannel(address))) {}

  grpc::Status Create(const TensorSpec& spec) {
    CreateTensorRequest req;
    *req.add_tensors() = spec;
    CreateTensorResponse resp;
    return Call(&ParameterServer::Stub::CreateTensor, req, &resp);
  }

  grpc::Status CreateTable(const TableSpec& spec) {
    CreateTensorRequest req;
    *req.add_tables() = spec;
    CreateTensorResponse resp;
    return Call(&ParameterServer::Stub::CreateTensor, req, &resp);
  }

  grpc::Status Pull(int32_t worker, uint64_t incarnation, int64_t clock,
                    const std::string& tensor, PullResponse* resp) {
    PullRequest req;
    *req.mutable_worker() = Ref(worker, incarnation, clock);
    req.add_tensors(tensor);
    return Call(&ParameterServer::Stub::Pull, req, resp);
  }

  // One gradient of `elems` floats (all 0.5) per entry of `slices`:
  // (tensor, slice, read_version).
  grpc::Status Push(int32_t worker, uint64_t incarnation, int64_t clock,
                    uint64_t seq,
                    const std::vector<std::pair<uint32_t, uint64_t>>& slices,
                    const std::string& tensor, size_t elems,
                    PushResponse* resp) {
    PushRequest req;
    *req.mutable_worker() = Ref(worker, incarnation, clock);
    req.set_seq(seq);
    const std::vector<float> grad(elems, 0.5f);
    for (const auto& [slice, read_version] : slices) {
      SliceGradient* g = req.add_grads();
      g->set_tensor(tensor);
      g->set_slice(slice);
      g->set_read_version(read_version);
      g->set_grad(reinterpret_cast<const char*>(grad.data()),
                  grad.size() * sizeof(float));
    }
    return Call(&ParameterServer::Stub::Push, req, resp);
  }

  grpc::Status Status(StatusResponse* resp) {
    return Call(&ParameterServer::Stub::Status, StatusRequest(), resp);
  }

 private:
  static WorkerRef Ref(int32_t worker, uint64_t incarnation, int64_t clock) {
    WorkerRef ref;
    ref.set_worker_id(worker);
    ref.set_incarnation(incarnation);
    ref.set_clock(clock);
    return ref;
  }

  template <typename Request, typename Response>
  grpc::Status Call(grpc::Status (ParameterServer::Stub::*method)(
                        grpc::ClientContext*, const Request&, Response*),
                    const Request& req, Response* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + kRpcDeadline));
    return (stub_.get()->*method)(&ctx, req, resp);
  }

  std::unique_ptr<ParameterServer::Stub> stub_;
};

// A float32 tensor of `elems` zeros, SGD with learning rate 1.
inline TensorSpec ZerosSpec(const std::string& name, int64_t elems,
                            int64_t slice_elems) {
  TensorSpec spec;
  spec.set_name(name);
  spec.add_shape(elems);
  spec.set_init(INIT_ZEROS);
  spec.mutable_optimizer()->set_type(OPT_SGD);
  spec.mutable_optimizer()->set_learning_rate(1.0f);
  spec.set_slice_elems(slice_elems);
  return spec;
}

}  // namespace testing
}  // namespace asyncps

#endif  // ASYNCPS_TESTS_MONITORING_SHARD_RPC_H_
