// Bad input over the wire, against a real ps_server process: every case gets
// the documented gRPC status, nothing is applied, and the shard keeps serving.
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>

#include "common/payload.h"
#include "common/net.h"
#include "proto/asyncps.grpc.pb.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

using testing::StartPsServer;

std::unique_ptr<grpc::ClientContext> Context() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return ctx;
}

TensorSpec Spec(int64_t n) {
  TensorSpec s;
  s.set_name("w");
  s.add_shape(n);
  s.set_init(INIT_CONSTANT);
  s.set_init_value(1.0f);
  s.set_slice_elems(n);  // one slice
  s.mutable_optimizer()->set_type(OPT_SGD);
  s.mutable_optimizer()->set_learning_rate(1.0f);
  return s;
}

PushRequest Push(uint64_t seq, std::vector<float> g, const std::string& tensor = "w",
                 uint32_t slice = 0) {
  PushRequest req;
  req.mutable_worker()->set_worker_id(0);
  req.mutable_worker()->set_incarnation(1);
  req.set_seq(seq);
  SliceGradient* sg = req.add_grads();
  sg->set_tensor(tensor);
  sg->set_slice(slice);
  EncodeFloats(g.data(), g.size(), sg->mutable_grad());
  return req;
}

struct Shard {
  testing::ServerProcess server;
  std::unique_ptr<ParameterServer::Stub> stub;

  // Values and version of the single slice of "w".
  std::pair<std::vector<float>, uint64_t> Read() {
    PullRequest req;
    req.mutable_worker()->set_worker_id(9);
    req.mutable_worker()->set_incarnation(1);
    req.add_tensors("w");
    PullResponse resp;
    REQUIRE(stub->Pull(Context().get(), req, &resp).ok());
    REQUIRE(resp.slices_size() == 1);
    std::vector<float> v(resp.slices(0).values().size() / sizeof(float));
    DecodeFloats(resp.slices(0).values(), v.data(), v.size());
    return {v, resp.slices(0).version()};
  }
};

Shard Start(std::vector<std::string> args, int64_t n) {
  auto server = StartPsServer(0, 1, args);
  REQUIRE(server.ok());
  Shard shard{*std::move(server), nullptr};
  shard.stub = ParameterServer::NewStub(MakeChannel(shard.server.address));
  CreateTensorRequest create;
  *create.add_tensors() = Spec(n);
  CreateTensorResponse created;
  REQUIRE(shard.stub->CreateTensor(Context().get(), create, &created).ok());
  return shard;
}

TEST_CASE("bad pushes get clear statuses over gRPC and change nothing",
          "[bad_input]") {
  Shard shard = Start({}, 4);
  const float nan = std::nanf("");
  struct Case {
    const char* what;
    PushRequest req;
    grpc::StatusCode code;
    const char* needle;
  };
  PushRequest bad_worker = Push(1, {1, 1, 1, 1});
  bad_worker.mutable_worker()->set_incarnation(0);
  std::vector<Case> cases = {
      {"unknown tensor", Push(1, {1, 1, 1, 1}, "nope"),
       grpc::StatusCode::NOT_FOUND, "nope"},
      {"wrong length", Push(1, {1, 1, 1}), grpc::StatusCode::INVALID_ARGUMENT,
       "holds 4 values"},
      {"wrong slice", Push(1, {1, 1, 1, 1}, "w", 7),
       grpc::StatusCode::INVALID_ARGUMENT, "does not exist"},
      {"NaN", Push(1, {1, nan, 1, 1}), grpc::StatusCode::INVALID_ARGUMENT,
       "NaN"},
      {"bad worker ref", bad_worker, grpc::StatusCode::INVALID_ARGUMENT,
       "incarnation"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    PushResponse resp;
    grpc::Status s = shard.stub->Push(Context().get(), c.req, &resp);
    REQUIRE(s.error_code() == c.code);
    REQUIRE(s.error_message().find(c.needle) != std::string::npos);
    auto [values, version] = shard.Read();
    REQUIRE(values == std::vector<float>(4, 1.0f));
    REQUIRE(version == 0);
  }
  // A good push still works afterwards.
  PushResponse ok;
  REQUIRE(shard.stub->Push(Context().get(), Push(1, {1, 2, 3, 4}), &ok).ok());
  REQUIRE(shard.Read().first == std::vector<float>{0, -1, -2, -3});
  StatusResponse status;
  REQUIRE(shard.stub->Status(Context().get(), StatusRequest(), &status).ok());
  REQUIRE(status.counters().rejected_bad_input() == cases.size());
  REQUIRE(status.counters().updates_applied() == 1);
}

TEST_CASE("an oversized request is RESOURCE_EXHAUSTED and changes nothing",
          "[bad_input]") {
  // 64 KiB limit; a 1M-float slice is 4 MiB.
  Shard shard = Start({"--max_message_bytes=65536"}, 1 << 20);
  PushResponse resp;
  grpc::Status s = shard.stub->Push(
      Context().get(), Push(1, std::vector<float>(1 << 20, 1.0f)), &resp);
  REQUIRE(s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  auto [values, version] = shard.Read();
  REQUIRE(version == 0);
  REQUIRE(values[0] == 1.0f);
  REQUIRE(values.back() == 1.0f);
}

TEST_CASE("malformed request bytes are refused; the shard keeps serving",
          "[bad_input]") {
  Shard shard = Start({}, 4);
  grpc::GenericStub generic(MakeChannel(shard.server.address));
  // Field 3 (grads) announced as 1000 bytes long, followed by 3 bytes.
  const char garbage[] = {0x1a, static_cast<char>(0xe8), 0x07, 'a', 'b', 'c'};
  grpc::Slice slice(garbage, sizeof(garbage));
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  auto ctx = Context();
  grpc::Status result;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  generic.UnaryCall(ctx.get(), "/asyncps.ParameterServer/Push",
                    grpc::StubOptions(), &request, &response,
                    [&](grpc::Status s) {
                      std::lock_guard<std::mutex> l(mu);
                      result = s;
                      done = true;
                      cv.notify_all();
                    });
  std::unique_lock<std::mutex> l(mu);
  REQUIRE(cv.wait_for(l, std::chrono::seconds(10), [&] { return done; }));
  REQUIRE_FALSE(result.ok());
  auto [values, version] = shard.Read();
  REQUIRE(version == 0);
  REQUIRE(values == std::vector<float>(4, 1.0f));
}

TEST_CASE("a conflicting create is ALREADY_EXISTS naming the field",
          "[bad_input]") {
  Shard shard = Start({}, 4);
  CreateTensorRequest create;
  *create.add_tensors() = Spec(4);
  create.mutable_tensors(0)->mutable_optimizer()->set_learning_rate(0.5f);
  CreateTensorResponse resp;
  grpc::Status s = shard.stub->CreateTensor(Context().get(), create, &resp);
  REQUIRE(s.error_code() == grpc::StatusCode::ALREADY_EXISTS);
  REQUIRE(s.error_message().find("learning_rate") != std::string::npos);
  // The identical spec is a no-op.
  *create.mutable_tensors(0) = Spec(4);
  REQUIRE(shard.stub->CreateTensor(Context().get(), create, &resp).ok());
  REQUIRE(resp.created() == 0);
}

}  // namespace
}  // namespace asyncps
