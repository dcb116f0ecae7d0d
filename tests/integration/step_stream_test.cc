// A step as one message per shard (StepStream, proto/asyncps.proto)
// against real ps_server processes: the push is applied exactly as on
// PushStream, then the pull it carries answers with the values after it;
// a retry applies nothing twice; a malformed step (its push or its pull)
// changes nothing; and
// PsClient::StartStep sends one request per shard, with the values a push
// and then a pull would give.
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "client/ps_client.h"
#include "common/net.h"
#include "proto/asyncps.grpc.pb.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/stream_helpers.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

using testing::Floats;

constexpr int kElems = 10;

// One shard holding "w": kElems floats, all 1, one slice, SGD with lr 1.
struct Shard : testing::OneTensorShard {
  Counters GetCounters() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(10));
    StatusResponse r;
    REQUIRE(stub->Status(&ctx, StatusRequest(), &r).ok());
    return r.counters();
  }

  // Values and version of "w", read by a reader (which changes nothing).
  std::pair<std::vector<float>, uint64_t> Read() {
    PullRequest pull;
    pull.set_read_only(true);
    pull.add_tensors("w");
    PullResponse r = streams->Pull(pull);
    REQUIRE(r.status().code() == 0);
    REQUIRE(r.slices_size() == 1);
    return {Values(r.slices(0)), r.slices(0).version()};
  }

  static std::vector<float> Values(const SliceData& d) {
    std::vector<float> v(d.values().size() / sizeof(float));
    std::memcpy(v.data(), d.values().data(), d.values().size());
    return v;
  }
};

Shard StartOne() { return Shard{testing::StartOneTensorShard(kElems)}; }

// Worker 0's push of `grad` to every element of "w" with sequence number
// `seq`, carrying the pull of the next step (clock 1) of "w".
PushRequest StepOf(uint64_t seq, float grad) {
  PushRequest push;
  push.mutable_worker()->set_worker_id(0);
  push.mutable_worker()->set_incarnation(1);
  push.set_seq(seq);
  SliceGradient* g = push.add_grads();
  g->set_tensor("w");
  g->set_slice(0);
  g->set_grad(Floats(std::vector<float>(kElems, grad)));
  PullRequest* pull = push.mutable_then_pull();
  *pull->mutable_worker() = push.worker();
  pull->mutable_worker()->set_clock(1);
  pull->set_for_clock(1);
  pull->add_tensors("w");
  pull->set_wire_dtype(WIRE_F32);
  return push;
}

TEST_CASE(
    "StepStream applies the push, then answers its pull with the values "
    "after it; a retry applies nothing twice",
    "[stream][step]") {
  Shard shard = StartOne();
  PullResponse r = shard.streams->Step(StepOf(1, 0.25f));
  REQUIRE(r.status().code() == 0);
  REQUIRE(r.push().status().code() == 0);
  CHECK_FALSE(r.push().duplicate());
  REQUIRE(r.push().results_size() == 1);
  CHECK(r.push().results(0).outcome() == APPLIED);
  REQUIRE(r.slices_size() == 1);
  CHECK(r.slices(0).version() == 1);
  CHECK(Shard::Values(r.slices(0)) == std::vector<float>(kElems, 0.75f));
  CHECK(r.shard_epoch() != 0);

  // The same step again (a retry after a lost answer): acknowledged as a
  // duplicate, nothing applied twice, the pull answered again.
  PullResponse again = shard.streams->Step(StepOf(1, 0.25f));
  REQUIRE(again.status().code() == 0);
  CHECK(again.push().duplicate());
  REQUIRE(again.slices_size() == 1);
  CHECK(again.slices(0).version() == 1);
  CHECK(Shard::Values(again.slices(0)) == std::vector<float>(kElems, 0.75f));

  const Counters c = shard.GetCounters();
  CHECK(c.steps() == 2);
  CHECK(c.pushes() == 2);
  CHECK(c.duplicate_pushes() == 1);
  CHECK(c.updates_applied() == 1);
  CHECK(c.rejected_bad_input() == 0);
}

TEST_CASE("a malformed step is refused whole: nothing applied, nothing pulled",
          "[stream][step][bad_input]") {
  Shard shard = StartOne();
  PushRequest step = StepOf(1, 0.25f);
  std::string why;
  SECTION("no then_pull") {
    step.clear_then_pull();
    why = "no then_pull";
  }
  SECTION("another worker's pull") {
    step.mutable_then_pull()->mutable_worker()->set_worker_id(5);
    why = "pushing worker's own pull";
  }
  SECTION("a reader's pull") {
    step.mutable_then_pull()->clear_worker();
    step.mutable_then_pull()->set_for_clock(0);
    step.mutable_then_pull()->set_read_only(true);
    why = "pushing worker's own pull";
  }
  SECTION("a NaN in the gradient") {
    std::vector<float> g(kElems, 0.25f);
    g[7] = std::numeric_limits<float>::quiet_NaN();
    step.mutable_grads(0)->set_grad(Floats(g));
    why = "NaN";
  }
  SECTION("a gradient of the wrong size") {
    step.mutable_grads(0)->set_grad(Floats(std::vector<float>(kElems + 1)));
    why = "";
  }
  SECTION("seq 0") {
    step.set_seq(0);
    why = "seq";
  }
  PullResponse r = shard.streams->Step(step);
  CHECK(r.status().code() == static_cast<int>(grpc::INVALID_ARGUMENT));
  CHECK(r.push().status().code() == static_cast<int>(grpc::INVALID_ARGUMENT));
  CHECK_THAT(r.status().message(), Catch::Contains(why));
  CHECK(r.push().results_size() == 0);
  CHECK(r.slices_size() == 0);
  const auto [values, version] = shard.Read();
  CHECK(values == std::vector<float>(kElems, 1.0f));
  CHECK(version == 0);
  const Counters c = shard.GetCounters();
  CHECK(c.updates_applied() == 0);
  CHECK(c.steps() == 0);
  CHECK(c.rejected_bad_input() >= 1);
}

TEST_CASE("unreadable step frames are refused and the stream goes on",
          "[stream][step][bad_input]") {
  Shard shard = StartOne();
  const std::string huge_length("\xff\xff\xff\x7f", 4);
  const std::vector<std::string> unreadable = {
      "",
      std::string("\x05\x00", 2),
      huge_length + "abc",
      std::string("\x05\x00\x00\x00", 4) + std::string(60, '\xff'),
  };
  for (const std::string& bytes : unreadable) {
    const PullResponse r =
        shard.streams->StepFrame(0, testing::Sliced(bytes, 3));
    CHECK(r.status().code() == static_cast<int>(grpc::INVALID_ARGUMENT));
    CHECK(r.push().status().code() == static_cast<int>(grpc::INVALID_ARGUMENT));
    CHECK(r.slices_size() == 0);
  }
  CHECK(shard.GetCounters().rejected_bad_input() == unreadable.size());
  CHECK(shard.Read().second == 0);
  // The same stream still serves a good step.
  const PullResponse r = shard.streams->Step(StepOf(1, 0.25f));
  REQUIRE(r.status().code() == 0);
  REQUIRE(r.slices_size() == 1);
  CHECK(r.slices(0).version() == 1);
}

TEST_CASE("then_pull is refused on PushStream, with nothing applied",
          "[stream][step][bad_input]") {
  Shard shard = StartOne();
  PushResponse r = shard.streams->Push(StepOf(1, 0.25f));
  CHECK(r.status().code() == static_cast<int>(grpc::INVALID_ARGUMENT));
  CHECK_THAT(r.status().message(), Catch::Contains("StepStream"));
  CHECK(shard.Read().second == 0);
}

TEST_CASE("a step whose pull is bad is refused whole, its push not applied",
          "[stream][step][bad_input]") {
  Shard shard = StartOne();
  PushRequest step = StepOf(1, 0.25f);
  SECTION("an unknown tensor") {
    step.mutable_then_pull()->add_tensors("nope");
  }
  SECTION("an unknown wire type") {
    step.mutable_then_pull()->set_wire_dtype(static_cast<WireDtype>(9));
  }
  PullResponse r = shard.streams->Step(step);
  CHECK(r.status().code() != 0);
  CHECK(r.push().status().code() == r.status().code());
  CHECK(r.push().results_size() == 0);
  CHECK(r.slices_size() == 0);
  const auto [values, version] = shard.Read();
  CHECK(values == std::vector<float>(kElems, 1.0f));
  CHECK(version == 0);
  CHECK(shard.GetCounters().updates_applied() == 0);
  CHECK(shard.GetCounters().rejected_bad_input() == 1);
  // The same step with a good pull goes through.
  r = shard.streams->Step(StepOf(1, 0.25f));
  REQUIRE(r.status().code() == 0);
  CHECK(r.push().results(0).outcome() == APPLIED);
}

TEST_CASE(
    "PsClient::PushThenPull: one request per shard, the values and versions "
    "a push and then a pull give",
    "[stream][step][sharding]") {
  auto cluster = testing::StartPsCluster(2, {"--log_level=warn"});
  REQUIRE_OK(cluster.status());
  PsClientOptions o;
  o.servers = {(*cluster)[0].address, (*cluster)[1].address};
  auto connected = PsClient::Connect(o);
  REQUIRE_OK(connected.status());
  PsClient& client = **connected;
  std::vector<TensorSpec> specs(2);
  specs[0].set_name("a");
  specs[0].add_shape(1000);
  specs[0].set_slice_elems(100);  // 10 slices over both shards
  specs[1].set_name("b");
  specs[1].add_shape(3);
  for (TensorSpec& s : specs) {
    s.set_init(INIT_CONSTANT);
    s.set_init_value(1.0f);
    s.mutable_optimizer()->set_type(OPT_SGD);
    s.mutable_optimizer()->set_learning_rate(0.5f);
  }
  REQUIRE_OK(client.CreateTensors(specs));
  std::vector<float> a(1000), b(3);
  REQUIRE_OK(client.Pull(0, {{"a", a.data()}, {"b", b.data()}}));

  std::vector<float> ga(1000), gb(3, 2.0f);
  for (int i = 0; i < 1000; ++i) ga[i] = static_cast<float>(i % 7);
  PushSet grads;
  grads.tensors = {{"a", ga.data()}, {"b", gb.data()}};
  absl::StatusOr<PushSummary> pushed =
      client.PushThenPull(0, grads, {{"a", a.data()}, {"b", b.data()}});
  REQUIRE_OK(pushed.status());
  CHECK(pushed->applied == 11);
  CHECK(pushed->duplicates == 0);
  for (int i = 0; i < 1000; ++i) {
    REQUIRE(a[i] == 1.0f - 0.5f * static_cast<float>(i % 7));
  }
  CHECK(b == std::vector<float>(3, 0.0f));
  // What the step's pull read is what the next push is measured against.
  CHECK(client.PulledVersions("a") == std::vector<uint64_t>(10, 1));
  CHECK(client.PulledVersions("b") == std::vector<uint64_t>{1});

  // Each shard got the step as one request: a push that carried the pull.
  absl::StatusOr<std::vector<StatusResponse>> status = client.Status();
  REQUIRE_OK(status.status());
  for (const StatusResponse& s : *status) {
    CHECK(s.counters().steps() == 1);
    CHECK(s.counters().pushes() == 1);
    CHECK(s.counters().pulls() == 2);  // the first pull, and the step's
  }

  // A plain pull reads the same.
  std::vector<float> a2(1000), b2(3);
  REQUIRE_OK(client.Pull(1, {{"a", a2.data()}, {"b", b2.data()}}));
  CHECK(a2 == a);
  CHECK(b2 == b);

  // A NaN is refused before anything is sent, the pull with it.
  gb[1] = std::nanf("");
  pushed = client.PushThenPull(1, grads, {{"a", a.data()}, {"b", b.data()}});
  CHECK(pushed.status().code() == absl::StatusCode::kInvalidArgument);
  status = client.Status();
  REQUIRE_OK(status.status());
  for (const StatusResponse& s : *status) CHECK(s.counters().steps() == 1);
}

}  // namespace
}  // namespace asyncps
