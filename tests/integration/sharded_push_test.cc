// Real ps_server shards (separate processes on port 0) driven by PsClient,
// by push_client processes and by raw stubs.

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/ps_client.h"
#include "common/net.h"
#include "common/shard_map.h"
#include "common/tensor_layout.h"
#include "proto/asyncps.grpc.pb.h"
#include "proto/asyncps.pb.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/tcp_proxy.h"

namespace asyncps {
namespace {

using testing::RunfilePath;
using testing::ServerList;
using testing::ServerProcess;
using testing::StartPsCluster;
using testing::Subprocess;

// A constant-initialized tensor trained by plain SGD with learning rate 1,
// so that after pushes of gradients g the value is init - sum(g), exactly.
TensorSpec ConstantSgdSpec(const std::string& name, std::vector<int64_t> shape,
                           float init_value, int64_t slice_elems) {
  TensorSpec spec;
  spec.set_name(name);
  for (int64_t d : shape) spec.add_shape(d);
  spec.set_init(INIT_CONSTANT);
  spec.set_init_value(init_value);
  spec.mutable_optimizer()->set_type(OPT_SGD);
  spec.mutable_optimizer()->set_learning_rate(1.0f);
  spec.set_slice_elems(slice_elems);
  return spec;
}

std::vector<ServerProcess> StartCluster(int shards) {
  absl::StatusOr<std::vector<ServerProcess>> cluster =
      StartPsCluster(shards, {"--log_level=info"});
  REQUIRE_OK(cluster.status());
  return *std::move(cluster);
}

std::vector<std::string> Addresses(const std::vector<ServerProcess>& cluster) {
  std::vector<std::string> out;
  for (const ServerProcess& s : cluster) out.push_back(s.address);
  return out;
}

std::unique_ptr<PsClient> ConnectClient(
    const std::vector<ServerProcess>& cluster, int32_t worker_id) {
  PsClientOptions options;
  options.servers = Addresses(cluster);
  options.worker_id = worker_id;
  options.retry.call_deadline = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<PsClient>> client =
      PsClient::Connect(std::move(options));
  REQUIRE_OK(client.status());
  return *std::move(client);
}

int64_t NumElems(const TensorSpec& spec) {
  int64_t n = 1;
  for (int64_t d : spec.shape()) n *= d;
  return n;
}

TEST_CASE("concurrent workers on two shards: every push lands exactly once",
          "[integration][push]") {
  constexpr int kShards = 2;
  constexpr int kWorkers = 3;
  constexpr int kPushes = 50;
  constexpr float kInit = 1.0f;
  std::vector<ServerProcess> cluster = StartCluster(kShards);
  std::unique_ptr<PsClient> creator = ConnectClient(cluster, /*worker_id=*/100);

  // 30 elements in 8 slices and 7 in 2: both tensors span both shards.
  const std::vector<TensorSpec> specs = {
      ConstantSgdSpec("w", {5, 6}, kInit, /*slice_elems=*/4),
      ConstantSgdSpec("b", {7}, kInit, /*slice_elems=*/4)};
  REQUIRE_OK(creator->CreateTensors(specs));
  int64_t total_slices = 0;
  for (const TensorSpec& spec : specs) {
    absl::StatusOr<TensorLayout> layout = TensorLayout::FromSpec(spec);
    REQUIRE(layout.ok());
    std::vector<int> per_shard(kShards, 0);
    for (uint32_t i = 0; i < layout->num_slices(); ++i) {
      ++per_shard[ShardMap::Static(kShards)->SliceHome(spec.name(), i)];
    }
    INFO("tensor " << spec.name());
    REQUIRE(per_shard[0] > 0);
    REQUIRE(per_shard[1] > 0);
    total_slices += layout->num_slices();
  }

  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int w = 0; w < kWorkers; ++w) {
    absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Start(
        RunfilePath("tests/integration/push_client"),
        {absl::StrCat("--servers=", ServerList(cluster)),
         absl::StrCat("--worker_id=", w), absl::StrCat("--pushes=", kPushes),
         absl::StrCat("--grad=", w + 1), "--tensors=w,b"});
    REQUIRE_OK(p.status());
    workers.push_back(*std::move(p));
  }
  for (int w = 0; w < kWorkers; ++w) {
    absl::StatusOr<int> code = workers[w]->Wait(absl::Seconds(120));
    INFO("worker " << w << " log:\n" << workers[w]->LogTail());
    REQUIRE_OK(code.status());
    REQUIRE(*code == 0);
  }
  for (const ServerProcess& s : cluster) {
    INFO("server log:\n" << s.process->LogTail());
    REQUIRE(s.process->Running());
  }

  // Worker w pushed w + 1 per element kPushes times: 50 * (1 + 2 + 3).
  const float expected = kInit - kPushes * (kWorkers * (kWorkers + 1) / 2);
  const int64_t total_pushes = kWorkers * kPushes;
  for (const TensorSpec& spec : specs) {
    std::vector<float> values(NumElems(spec), 0.0f);
    REQUIRE_OK(creator->Pull(kPushes, {{spec.name(), values.data()}}));
    for (size_t i = 0; i < values.size(); ++i) {
      INFO(spec.name() << "[" << i << "]");
      CHECK(values[i] == expected);
    }
    const std::vector<uint64_t> versions = creator->PulledVersions(spec.name());
    REQUIRE(!versions.empty());
    for (size_t i = 0; i < versions.size(); ++i) {
      INFO(spec.name() << " slice " << i);
      CHECK(versions[i] == static_cast<uint64_t>(total_pushes));
    }
  }

  absl::StatusOr<std::vector<StatusResponse>> status = creator->Status();
  REQUIRE_OK(status.status());
  REQUIRE(status->size() == kShards);
  uint64_t updates = 0, duplicates = 0;
  for (int s = 0; s < kShards; ++s) {
    CHECK((*status)[s].shard_index() == s);
    CHECK((*status)[s].num_shards() == kShards);
    updates += (*status)[s].counters().updates_applied();
    duplicates += (*status)[s].counters().duplicate_pushes();
  }
  CHECK(updates == static_cast<uint64_t>(total_pushes * total_slices));
  CHECK(duplicates == 0);
}

// Pushes `value` to every slice of `spec` on a one-shard cluster through a
// raw stub, as a retrying worker would resend it.
PushResponse RawPush(ParameterServer::Stub* stub, const TensorSpec& spec,
                     uint64_t seq, float value) {
  absl::StatusOr<TensorLayout> layout = TensorLayout::FromSpec(spec);
  REQUIRE(layout.ok());
  PushRequest request;
  request.mutable_worker()->set_worker_id(7);
  request.mutable_worker()->set_incarnation(42);
  request.mutable_worker()->set_clock(0);
  request.set_seq(seq);
  for (uint32_t i = 0; i < layout->num_slices(); ++i) {
    SliceGradient* g = request.add_grads();
    g->set_tensor(spec.name());
    g->set_slice(i);
    g->set_read_version(0);
    const std::vector<float> grad(layout->SliceSize(i), value);
    g->set_grad(grad.data(), grad.size() * sizeof(float));
  }
  PushResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  const grpc::Status s = stub->Push(&ctx, request, &response);
  INFO(s.error_message());
  REQUIRE(s.ok());
  return response;
}

TEST_CASE("a resent push with the same sequence number is applied once",
          "[integration][dedup]") {
  std::vector<ServerProcess> cluster = StartCluster(1);
  std::unique_ptr<PsClient> client = ConnectClient(cluster, /*worker_id=*/0);
  const TensorSpec spec = ConstantSgdSpec("v", {10}, 0.0f, /*slice_elems=*/4);
  REQUIRE_OK(client->CreateTensors({spec}));
  auto stub = ParameterServer::NewStub(MakeChannel(cluster[0].address));
  std::vector<float> values(10);

  PushResponse first = RawPush(stub.get(), spec, /*seq=*/1, 2.0f);
  CHECK_FALSE(first.duplicate());
  REQUIRE(first.results_size() == 3);
  for (const SliceResult& r : first.results()) CHECK(r.outcome() == APPLIED);

  PushResponse resent = RawPush(stub.get(), spec, /*seq=*/1, 2.0f);
  CHECK(resent.duplicate());
  REQUIRE_OK(client->Pull(0, {{"v", values.data()}}));
  for (float v : values) CHECK(v == -2.0f);
  for (uint64_t version : client->PulledVersions("v")) CHECK(version == 1);

  // A later sequence number is applied; an older one is still a duplicate.
  CHECK_FALSE(RawPush(stub.get(), spec, /*seq=*/2, 2.0f).duplicate());
  CHECK(RawPush(stub.get(), spec, /*seq=*/1, 2.0f).duplicate());
  REQUIRE_OK(client->Pull(0, {{"v", values.data()}}));
  for (float v : values) CHECK(v == -4.0f);
  for (uint64_t version : client->PulledVersions("v")) CHECK(version == 2);

  absl::StatusOr<std::vector<StatusResponse>> status = client->Status();
  REQUIRE_OK(status.status());
  CHECK((*status)[0].counters().duplicate_pushes() == 2);
}

TEST_CASE("client checks its inputs and names the shard in server errors",
          "[integration][client]") {
  std::vector<ServerProcess> cluster = StartCluster(2);
  std::unique_ptr<PsClient> creator = ConnectClient(cluster, /*worker_id=*/0);
  const TensorSpec spec = ConstantSgdSpec("t", {3, 3}, 0.5f, /*slice_elems=*/2);
  REQUIRE_OK(creator->CreateTensors({spec}));
  REQUIRE_OK(creator->CreateTensors({spec}));  // identical: a no-op

  std::vector<float> buffer(9);
  CHECK(absl::IsNotFound(creator->Pull(0, {{"nope", buffer.data()}})));
  CHECK(absl::IsInvalidArgument(creator->Pull(0, {{"t", nullptr}})));
  CHECK(absl::IsNotFound(creator->Push(0, {{"nope", buffer.data()}}).status()));
  CHECK(absl::IsInvalidArgument(creator->Push(0, {{"t", nullptr}}).status()));

  SECTION("a conflicting spec is refused by a named shard") {
    TensorSpec conflicting = spec;
    conflicting.set_init_value(0.25f);
    const absl::Status s = creator->CreateTensors({conflicting});
    CHECK(absl::IsAlreadyExists(s));
    CHECK(absl::StrContains(s.message(), "127.0.0.1:"));
  }

  SECTION("another worker waits for the tensors and sees the initial values") {
    std::unique_ptr<PsClient> other = ConnectClient(cluster, /*worker_id=*/1);
    CHECK(absl::IsNotFound(other->Pull(0, {{"t", buffer.data()}})));
    REQUIRE_OK(other->WaitForTensors({"t"}, absl::Seconds(30)));
    REQUIRE(other->FindSpec("t") != nullptr);
    CHECK(other->FindSpec("t")->slice_elems() == 2);
    REQUIRE_OK(other->Pull(0, {{"t", buffer.data()}}));
    for (float v : buffer) CHECK(v == 0.5f);
    const absl::Status missing =
        other->WaitForTensors({"t", "later"}, absl::Milliseconds(200));
    CHECK(absl::IsDeadlineExceeded(missing));
    INFO(missing.ToString());
    CHECK(absl::StrContains(missing.message(), "'later'"));
  }
}

// Sits between a client and one shard and forwards every call; the first
// `lost_push_responses` pushes reach the shard but their answers are replaced
// by UNAVAILABLE, as when a connection drops after the shard applied them.
TEST_CASE("pushes retried after lost answers are applied once",
          "[integration][dedup]") {
  std::vector<ServerProcess> cluster = StartCluster(1);
  absl::StatusOr<std::unique_ptr<testing::TcpProxy>> proxy =
      testing::TcpProxy::Start(cluster[0].address);
  REQUIRE_OK(proxy.status());

  PsClientOptions options;
  options.servers = {(*proxy)->address()};
  options.retry.initial_backoff = absl::Milliseconds(10);
  options.retry.call_deadline = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<PsClient>> client =
      PsClient::Connect(std::move(options));
  REQUIRE_OK(client.status());
  // 1024 floats in 2 slices: a push is one request of a little over 4 KiB.
  const TensorSpec spec =
      ConstantSgdSpec("r", {1024}, 0.0f, /*slice_elems=*/512);
  REQUIRE_OK((*client)->CreateTensors({spec}));
  std::vector<float> values(1024);
  REQUIRE_OK((*client)->Pull(0, {{"r", values.data()}}));

  // Every push reaches the shard, and the connection is reset as soon as
  // the shard answers: the client never sees the answer and retries on a
  // new connection.
  const std::vector<float> grad(1024, 3.0f);
  constexpr int kPushes = 5;
  int64_t duplicates = 0;
  for (int k = 0; k < kPushes; ++k) {
    (*proxy)->LoseNextAnswers(1, /*min_request_bytes=*/4096);
    absl::StatusOr<PushSummary> summary =
        (*client)->Push(k, {{"r", grad.data()}});
    REQUIRE_OK(summary.status());
    duplicates += summary->duplicates;
  }
  CHECK((*proxy)->answers_lost() == kPushes);
  // Answers lost after the shard applied the push come back as duplicates
  // (a reset can also come before the shard read the whole request; that
  // push is then applied by its retry).
  CHECK(duplicates >= 1);

  REQUIRE_OK((*client)->Pull(kPushes, {{"r", values.data()}}));
  for (float v : values) REQUIRE(v == -3.0f * kPushes);
  for (uint64_t version : (*client)->PulledVersions("r")) {
    CHECK(version == kPushes);
  }
  absl::StatusOr<std::vector<StatusResponse>> status = (*client)->Status();
  REQUIRE_OK(status.status());
  CHECK((*status)[0].counters().duplicate_pushes() ==
        static_cast<uint64_t>(duplicates));
}

TEST_CASE("an unreachable shard fails after the configured attempts",
          "[integration][client]") {
  PsClientOptions options;
  absl::StatusOr<std::string> unused = testing::UnusedLoopbackAddress();
  REQUIRE_OK(unused.status());
  const std::string address = *unused;
  options.servers = {address};
  options.retry.max_attempts = 3;
  options.retry.initial_backoff = absl::Milliseconds(10);
  options.retry.attempt_timeout = absl::Seconds(5);
  absl::StatusOr<std::unique_ptr<PsClient>> client =
      PsClient::Connect(std::move(options));
  REQUIRE_OK(client.status());
  const absl::Status s = (*client)->Heartbeat(0);
  INFO(s.ToString());
  CHECK(absl::IsUnavailable(s));
  CHECK(absl::StrContains(s.message(), address));
  CHECK(absl::StrContains(s.message(), "after 3 attempts"));
}

}  // namespace
}  // namespace asyncps
