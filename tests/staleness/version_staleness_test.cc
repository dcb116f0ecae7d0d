// Write-side staleness against a real ps_server process: staleness =
// current version - read version, per slice, at apply time. Beyond
// --max_staleness a slice is refused and left untouched; with
// --staleness_lr=inverse the learning rate is divided by (1 + staleness).
//
// Values are chosen exactly representable in float32, so every check is ==.

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/ps_client.h"
#include "common/net.h"
#include "proto/asyncps.grpc.pb.h"
#include "proto/asyncps.pb.h"
#include "tests/staleness/harness.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace staleness {
namespace {

using Buffer = std::vector<float>;

std::unique_ptr<PsClient> Worker(const Shard& shard, int32_t id,
                                 const TensorSpec& spec) {
  absl::StatusOr<std::unique_ptr<PsClient>> client =
      ConnectWorker(shard.server.address, id);
  REQUIRE_OK(client.status());
  REQUIRE_OK((*client)->CreateTensors({spec}));
  return *std::move(client);
}

// One step of `client`: pull `name`, push `grad` computed from it.
void FreshStep(PsClient* client, const std::string& name, int64_t clock,
               const Buffer& grad) {
  Buffer scratch(grad.size());
  REQUIRE_OK(client->Pull(clock, {{name, scratch.data()}}));
  absl::StatusOr<PushSummary> summary =
      client->Push(clock, {{name, grad.data()}});
  REQUIRE_OK(summary.status());
  REQUIRE(summary->applied == 1);
  REQUIRE(summary->max_staleness == 0);
}

bool SameBits(const Buffer& a, const Buffer& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

SliceGradient Grad(const std::string& tensor, uint32_t slice,
                   uint64_t read_version, const Buffer& values) {
  SliceGradient g;
  g.set_tensor(tensor);
  g.set_slice(slice);
  g.set_read_version(read_version);
  g.set_grad(values.data(), values.size() * sizeof(float));
  return g;
}

// A raw push as worker 9 (incarnation 1) with sequence number `seq`.
PushResponse RawPush(ParameterServer::Stub* stub, uint64_t seq,
                     const std::vector<SliceGradient>& grads) {
  PushRequest request;
  request.mutable_worker()->set_worker_id(9);
  request.mutable_worker()->set_incarnation(1);
  request.mutable_worker()->set_clock(static_cast<int64_t>(seq));
  request.set_seq(seq);
  for (const SliceGradient& g : grads) *request.add_grads() = g;
  PushResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  const grpc::Status s = stub->Push(&ctx, request, &response);
  INFO(s.error_message());
  REQUIRE(s.ok());
  REQUIRE_FALSE(response.duplicate());
  return response;
}

TEST_CASE(
    "--max_staleness=2: a gradient 3 versions old is refused and "
    "changes nothing; 2 versions old is applied",
    "[staleness][bound]") {
  Shard shard = StartOneShard({"--max_staleness=2"});
  // One slice of 3, init 1, lr 1.
  const TensorSpec spec = ConstantSgdSpec("v", 3, 1.0f, 1.0f, 4);
  std::unique_ptr<PsClient> slow = Worker(shard, 0, spec);
  std::unique_ptr<PsClient> fast = Worker(shard, 1, spec);
  Buffer slow_view(3);
  const Buffer ones(3, 1.0f);
  const Buffer big(3, 100.0f);

  REQUIRE_OK(slow->Pull(0, {{"v", slow_view.data()}}));
  REQUIRE(slow->PulledVersions("v") == std::vector<uint64_t>{0});
  for (int c = 0; c < 3; ++c) FreshStep(fast.get(), "v", c, ones);

  Buffer before(3);
  REQUIRE_OK(fast->Pull(3, {{"v", before.data()}}));
  REQUIRE(fast->PulledVersions("v") == std::vector<uint64_t>{3});
  for (float v : before) REQUIRE(v == -2.0f);

  // Read at version 0, now 3: staleness 3 > 2.
  absl::StatusOr<PushSummary> refused = slow->Push(0, {{"v", big.data()}});
  REQUIRE_OK(refused.status());
  CHECK(refused->refused_stale == 1);
  CHECK(refused->applied == 0);
  CHECK(refused->max_staleness == 3);
  Buffer after(3);
  REQUIRE_OK(fast->Pull(3, {{"v", after.data()}}));
  CHECK(SameBits(before, after));
  CHECK(fast->PulledVersions("v") == std::vector<uint64_t>{3});

  // The slow worker re-pulls (version 3); two updates later: staleness 2.
  REQUIRE_OK(slow->Pull(1, {{"v", slow_view.data()}}));
  REQUIRE(slow->PulledVersions("v") == std::vector<uint64_t>{3});
  for (int c = 3; c < 5; ++c) FreshStep(fast.get(), "v", c, ones);
  absl::StatusOr<PushSummary> applied = slow->Push(1, {{"v", big.data()}});
  REQUIRE_OK(applied.status());
  CHECK(applied->applied == 1);
  CHECK(applied->refused_stale == 0);
  CHECK(applied->max_staleness == 2);
  REQUIRE_OK(fast->Pull(5, {{"v", after.data()}}));
  for (float v : after) CHECK(v == 1.0f - 5.0f - 100.0f);
  CHECK(fast->PulledVersions("v") == std::vector<uint64_t>{6});

  const StatusResponse status = shard.Status();
  CHECK(status.policy().max_staleness() == 2);
  CHECK(status.counters().refused_stale() == 1);
  CHECK(status.counters().updates_applied() == 6);
  CHECK(status.staleness().max() == 3);
  CHECK(status.staleness().sum() == 3 + 2);
  slow.reset();
  fast.reset();
  shard.Stop();
}

TEST_CASE(
    "the staleness bound is per slice: one push may be refused on one "
    "slice and applied on another",
    "[staleness][bound]") {
  Shard shard = StartOneShard({"--max_staleness=2"});
  // Two slices of 2, init 0, lr 1.
  const TensorSpec spec = ConstantSgdSpec("s", 4, 0.0f, 1.0f, 2);
  std::unique_ptr<PsClient> reader = Worker(shard, 0, spec);
  const Buffer ones(2, 1.0f);
  for (uint64_t v = 0; v < 3; ++v) {
    RawPush(shard.stub.get(), v + 1,
            {Grad("s", 0, v, ones), Grad("s", 1, v, ones)});
  }
  Buffer values(4);
  REQUIRE_OK(reader->Pull(0, {{"s", values.data()}}));
  REQUIRE(reader->PulledVersions("s") == std::vector<uint64_t>{3, 3});
  const Buffer before = values;

  const Buffer halves(2, 0.5f);
  const PushResponse r =
      RawPush(shard.stub.get(), 4,
              {Grad("s", 0, /*read_version=*/0, halves),    // 3 old: refused
               Grad("s", 1, /*read_version=*/1, halves)});  // 2 old: applied
  REQUIRE(r.results_size() == 2);
  CHECK(r.results(0).slice() == 0);
  CHECK(r.results(0).outcome() == REFUSED_STALE);
  CHECK(r.results(0).staleness() == 3);
  CHECK(r.results(0).new_version() == 3);
  CHECK(r.results(0).lr_scale() == 0.0f);
  CHECK(r.results(1).slice() == 1);
  CHECK(r.results(1).outcome() == APPLIED);
  CHECK(r.results(1).staleness() == 2);
  CHECK(r.results(1).new_version() == 4);
  CHECK(r.results(1).lr_scale() == 1.0f);

  REQUIRE_OK(reader->Pull(0, {{"s", values.data()}}));
  CHECK(reader->PulledVersions("s") == std::vector<uint64_t>{3, 4});
  CHECK(std::memcmp(values.data(), before.data(), 2 * sizeof(float)) == 0);
  CHECK(values[2] == -3.5f);
  CHECK(values[3] == -3.5f);
  CHECK(shard.Status().counters().refused_stale() == 1);
  reader.reset();
  shard.Stop();
}

TEST_CASE(
    "--staleness_lr=inverse: a gradient s versions old moves the "
    "weights by lr / (1 + s) times the gradient",
    "[staleness][inverse]") {
  Shard shard = StartOneShard({"--staleness_lr=inverse"});
  // One slice of 4, init 1, plain SGD with lr 0.5.
  const TensorSpec spec = ConstantSgdSpec("u", 4, 1.0f, 0.5f, 4);
  std::unique_ptr<PsClient> slow = Worker(shard, 0, spec);
  std::unique_ptr<PsClient> fast = Worker(shard, 1, spec);
  Buffer view(4);
  REQUIRE_OK(slow->Pull(0, {{"u", view.data()}}));
  // Three fresh pushes of 2 at full lr: 1 - 3 * 0.5 * 2 = -2.
  for (int c = 0; c < 3; ++c) FreshStep(fast.get(), "u", c, Buffer(4, 2.0f));

  // Staleness 3: lr 0.5 / 4 = 0.125.
  const Buffer grad = {1.0f, 2.0f, 4.0f, -8.0f};
  absl::StatusOr<PushSummary> summary = slow->Push(0, {{"u", grad.data()}});
  REQUIRE_OK(summary.status());
  CHECK(summary->applied == 1);
  CHECK(summary->max_staleness == 3);
  REQUIRE_OK(fast->Pull(3, {{"u", view.data()}}));
  CHECK(view == Buffer{-2.125f, -2.25f, -2.5f, -1.0f});
  CHECK(fast->PulledVersions("u") == std::vector<uint64_t>{4});

  // Staleness 1, seen in the raw response: scale 1/2, lr 0.25.
  const PushResponse r =
      RawPush(shard.stub.get(), 1, {Grad("u", 0, 3, Buffer(4, 2.0f))});
  REQUIRE(r.results_size() == 1);
  CHECK(r.results(0).outcome() == APPLIED);
  CHECK(r.results(0).staleness() == 1);
  CHECK(r.results(0).lr_scale() == 0.5f);
  CHECK(r.results(0).new_version() == 5);
  REQUIRE_OK(fast->Pull(3, {{"u", view.data()}}));
  CHECK(view == Buffer{-2.625f, -2.75f, -3.0f, -1.5f});

  const StatusResponse status = shard.Status();
  CHECK(status.policy().staleness_lr() == "inverse");
  CHECK(status.counters().scaled() == 2);
  CHECK(status.counters().updates_applied() == 5);
  CHECK(status.counters().refused_stale() == 0);
  slow.reset();
  fast.reset();
  shard.Stop();
}

}  // namespace
}  // namespace staleness
}  // namespace asyncps
