// Bad input over the wire, against a real ps_server process: every case gets
// the documented gRPC status (on the streams, the answer's status), nothing
// is applied, and the shard keeps serving.
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "common/net.h"
#include "common/payload.h"
#include "proto/asyncps.grpc.pb.h"
#include "tests/testing/raw_calls.h"
#include "tests/testing/stream_helpers.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

using testing::StartPsServer;

std::unique_ptr<grpc::ClientContext> Context() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::seconds(10));
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

PushRequest Push(uint64_t seq, std::vector<float> g,
                 const std::string& tensor = "w", uint32_t slice = 0) {
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

// Worker references a shard must refuse, whatever else the request holds.
std::vector<std::pair<const char*, WorkerRef>> MalformedRefs() {
  std::vector<std::pair<const char*, WorkerRef>> out(3);
  for (auto& [what, ref] : out) {
    ref.set_worker_id(2);
    ref.set_incarnation(5);
    ref.set_clock(3);
  }
  out[0].first = "worker id -1";
  out[0].second.set_worker_id(-1);
  out[1].first = "incarnation 0";
  out[1].second.set_incarnation(0);
  out[2].first = "clock -1";
  out[2].second.set_clock(-1);
  return out;
}

PullRequest PullOf(const std::string& tensor) {
  PullRequest req;
  req.add_tensors(tensor);
  return req;
}

TEST_CASE(
    "a malformed worker reference is INVALID_ARGUMENT whatever the push or "
    "pull holds, on the unary RPCs and the streams, and changes nothing",
    "[bad_input][identity]") {
  Shard shard = Start({}, 4);
  testing::ShardStreams streams(MakeChannel(shard.server.address));
  PushRequest unknown_table = Push(1, {1, 1, 1, 1});
  RowsGradient* rows = unknown_table.add_rows();
  rows->set_table("no_table");
  rows->add_ids(1);
  rows->set_grad(std::string(4, '\0'));
  const std::vector<std::pair<const char*, PushRequest>> pushes = {
      {"unknown tensor", Push(1, {1, 1, 1, 1}, "nope")},
      {"empty tensor name", Push(1, {1, 1, 1, 1}, "")},
      {"wrong-length gradient", Push(1, {1, 1, 1})},
      {"rows of an unknown table", unknown_table},
  };
  PullRequest unknown_rows = PullOf("w");
  unknown_rows.add_rows()->set_table("no_table");
  const std::vector<std::pair<const char*, PullRequest>> pulls = {
      {"unknown tensor", PullOf("nope")},
      {"empty tensor name", PullOf("")},
      {"rows of an unknown table", unknown_rows},
  };
  const std::string needle = "malformed worker reference";
  uint64_t refused = 0;
  for (const auto& [ref_what, ref] : MalformedRefs()) {
    for (auto [what, req] : pushes) {
      INFO("push, " << ref_what << ", " << what);
      *req.mutable_worker() = ref;
      PushResponse resp;
      const grpc::Status s = shard.stub->Push(Context().get(), req, &resp);
      CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
      CHECK_THAT(s.error_message(), Catch::Contains(needle));
      const PushResponse streamed = streams.Push(req);
      CHECK(streamed.status().code() ==
            static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
      CHECK_THAT(streamed.status().message(), Catch::Contains(needle));
      CHECK(streamed.results_size() == 0);
      refused += 2;
    }
    for (auto [what, req] : pulls) {
      INFO("pull, " << ref_what << ", " << what);
      *req.mutable_worker() = ref;
      PullResponse resp;
      const grpc::Status s = shard.stub->Pull(Context().get(), req, &resp);
      CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
      CHECK_THAT(s.error_message(), Catch::Contains(needle));
      const PullResponse streamed = streams.Pull(req);
      CHECK(streamed.status().code() ==
            static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
      CHECK_THAT(streamed.status().message(), Catch::Contains(needle));
      CHECK(streamed.slices_size() == 0);
      refused += 2;
    }
  }
  // Nothing applied, read or registered; every call counted as bad input.
  StatusResponse status;
  REQUIRE(shard.stub->Status(Context().get(), StatusRequest(), &status).ok());
  CHECK(status.counters().rejected_bad_input() == refused);
  CHECK(status.counters().pushes() == 0);
  CHECK(status.counters().updates_applied() == 0);
  CHECK(status.counters().pulls() == 0);
  CHECK(status.workers_size() == 0);
  auto [values, version] = shard.Read();
  CHECK(version == 0);
  CHECK(values == std::vector<float>(4, 1.0f));
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

Counters GetCounters(Shard& shard) {
  StatusResponse r;
  REQUIRE(shard.stub->Status(Context().get(), StatusRequest(), &r).ok());
  return r.counters();
}

TEST_CASE(
    "requests of tiny repeated items that would take far more memory than "
    "their size are RESOURCE_EXHAUSTED before parsing, counted, and change "
    "nothing",
    "[bad_input][isolation]") {
  Shard shard = Start({}, 4);
  const pid_t pid = shard.server.process->pid();
  const int64_t before = testing::ReadProcessResources(pid)->rss_bytes;
  // 32 MiB each of empty SliceGradients (Push), empty tensor names and
  // empty row lists (Pull): 2 bytes on the wire, ~90 bytes parsed (64 MiB
  // made a shard allocate 2.8 GB before the check).
  struct Flood {
    std::string method, unit;
  };
  const std::vector<Flood> floods = {
      {"Push", std::string("\x1a\x00", 2)},
      {"Pull", std::string("\x12\x00", 2)},
      {"Pull", std::string("\x32\x00", 2)},
  };
  const auto channel = MakeChannel(shard.server.address);
  for (const Flood& f : floods) {
    std::string body;
    body.reserve(32 << 20);
    while (body.size() < (32u << 20)) body += f.unit;
    const grpc::Status s = testing::RawUnary(
        channel, "/asyncps.ParameterServer/" + f.method, body, 60);
    INFO(f.method << ": " << s.error_message());
    CHECK(s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
    CHECK(s.error_message().find("parsing it would take more than") !=
          std::string::npos);
  }
  const int64_t after = testing::ReadProcessResources(pid)->rss_bytes;
  INFO("RSS " << before / 1e6 << " MB -> " << after / 1e6 << " MB");
  // The requests' own bytes pass through gRPC's buffers; nothing near the
  // gigabytes their parsed forms would take.
  CHECK(after - before < (400 << 20));
  CHECK(GetCounters(shard).rejected_bad_input() == floods.size());
  auto [values, version] = shard.Read();
  CHECK(version == 0);
  CHECK(values == std::vector<float>(4, 1.0f));
}

TEST_CASE(
    "SlotMoves requests that would parse into far more memory than their "
    "size, or do not parse, are refused before anything runs",
    "[bad_input][isolation]") {
  Shard shard = Start({}, 4);
  const pid_t pid = shard.server.process->pid();
  const int64_t before = testing::ReadProcessResources(pid)->peak_rss_bytes;
  // 32 MiB of empty unknown fields (field 15): gRPC's typed parse of 64 MiB
  // of them sent to MoveState took a shard to 2.2 GB.
  const std::string flood = testing::EmptyUnknownFields(32 << 20);
  const std::string garbage("\x1a\xe8\x07abc", 6);
  const auto channel = MakeChannel(shard.server.address);
  for (const std::string m :
       {"MoveSlots", "ExportSlots", "FinishMove", "MoveState", "AdoptMap",
        "ReadMapRecord", "SwapMapRecord"}) {
    INFO(m);
    grpc::Status s =
        testing::RawUnary(channel, "/asyncps.SlotMoves/" + m, flood, 60);
    INFO(s.error_message());
    CHECK(s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
    CHECK(s.error_message().find("parsing it would take more than") !=
          std::string::npos);
    s = testing::RawUnary(channel, "/asyncps.SlotMoves/" + m, garbage);
    CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(s.error_message().find("does not parse") != std::string::npos);
  }
  const int64_t after = testing::ReadProcessResources(pid)->peak_rss_bytes;
  INFO("peak RSS " << before / 1e6 << " MB -> " << after / 1e6 << " MB");
  CHECK(after - before < (400 << 20));
  auto [values, version] = shard.Read();
  CHECK(version == 0);
  CHECK(values == std::vector<float>(4, 1.0f));
}

TEST_CASE(
    "request bytes that do not parse are INVALID_ARGUMENT on every "
    "method, counted, and change nothing",
    "[bad_input]") {
  Shard shard = Start({}, 4);
  // Field 3 announced as 1000 bytes long, followed by 3 bytes.
  const std::string garbage(
      "\x1a\xe8\x07"
      "abc",
      6);
  const std::vector<std::string> methods = {
      "CreateTensor", "ListTensors", "SetLearningRate", "Heartbeat",
      "Pull",         "Push",        "Status",          "Checkpoint"};
  for (const std::string& m : methods) {
    INFO(m);
    const grpc::Status s =
        testing::RawUnary(MakeChannel(shard.server.address),
                          "/asyncps.ParameterServer/" + m, garbage);
    CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(s.error_message().find("does not parse") != std::string::npos);
  }
  CHECK(GetCounters(shard).rejected_bad_input() == methods.size());
  auto [values, version] = shard.Read();
  REQUIRE(version == 0);
  REQUIRE(values == std::vector<float>(4, 1.0f));
}

TEST_CASE("bad names and shapes: overflow, memory cap, non-UTF-8, huge names",
          "[bad_input]") {
  // A cap of 64 KiB of parameters on this shard.
  Shard shard = Start({"--max_parameter_bytes=64K"}, 4);
  auto create = [&](const TensorSpec& spec) {
    CreateTensorRequest req;
    *req.add_tensors() = spec;
    CreateTensorResponse resp;
    return shard.stub->CreateTensor(Context().get(), req, &resp);
  };
  auto status = [&] {
    StatusResponse r;
    REQUIRE(shard.stub->Status(Context().get(), StatusRequest(), &r).ok());
    return r;
  };
  const uint64_t reserved = status().reserved_parameter_bytes();
  CHECK(status().max_parameter_bytes() == 64 << 10);
  uint64_t refused = 0;

  SECTION("element counts that overflow int64") {
    for (const std::vector<int64_t>& shape :
         {std::vector<int64_t>{INT64_MAX},
          std::vector<int64_t>{3, 3074457345618258602},
          std::vector<int64_t>{1 << 20, 1 << 20, 1 << 20, 1 << 20}}) {
      TensorSpec spec = Spec(1);
      spec.set_name("huge");
      spec.clear_shape();
      for (int64_t d : shape) spec.add_shape(d);
      spec.set_slice_elems(0);
      const grpc::Status s = create(spec);
      INFO(s.error_message());
      // Either too large to describe, or beyond the memory cap: never a
      // wrong slice count, never an allocation.
      CHECK((s.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
             s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED));
      ++refused;
    }
  }
  SECTION("a tensor beyond the memory cap") {
    TensorSpec spec = Spec(1);
    spec.set_name("big");
    spec.set_shape(0, int64_t{1} << 36);
    spec.set_slice_elems(0);
    const grpc::Status s = create(spec);
    CHECK(s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
    CHECK(s.error_message().find("--max_parameter_bytes") != std::string::npos);
    CHECK(s.error_message().find("65536") != std::string::npos);
    ++refused;
    // Just under the cap works; then one more does not.
    TensorSpec fits = Spec(4096);  // 16 KiB of values, SGD
    fits.set_name("fits");
    CHECK(create(fits).ok());
    TensorSpec over = Spec(16384);  // 64 KiB more
    over.set_name("over");
    CHECK(create(over).error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
    ++refused;
  }
  SECTION("names that are not UTF-8, or control characters") {
    for (const std::string& name :
         {std::string("bad\xff\xfename"), std::string("nul\0in", 6),
          std::string("tab\there")}) {
      TensorSpec spec = Spec(4);
      spec.set_name(name);
      const grpc::Status s = create(spec);
      CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
      CHECK(s.error_message().size() < 300);
      ++refused;
    }
    // A pull naming one is refused the same way, before any lookup.
    PullRequest pull;
    pull.mutable_worker()->set_worker_id(1);
    pull.mutable_worker()->set_incarnation(1);
    pull.add_tensors("bad\xff");
    PullResponse presp;
    CHECK(shard.stub->Pull(Context().get(), pull, &presp).error_code() ==
          grpc::StatusCode::NOT_FOUND);
    ++refused;
  }
  SECTION("a 1 MiB unknown name is quoted short, and the channel goes on") {
    const std::string name(1 << 20, 'x');
    PushResponse resp;
    const grpc::Status s =
        shard.stub->Push(Context().get(), Push(1, {1, 1, 1, 1}, name), &resp);
    CHECK(s.error_code() == grpc::StatusCode::NOT_FOUND);
    CHECK(s.error_message().size() < 300);
    CHECK(s.error_message().find("(1048576 bytes)") != std::string::npos);
    ++refused;
    PushResponse ok;
    CHECK(shard.stub->Push(Context().get(), Push(2, {1, 1, 1, 1}), &ok).ok());
    auto [values, version] = shard.Read();
    CHECK(version == 1);
    return;
  }
  const StatusResponse after = status();
  CHECK(after.counters().rejected_bad_input() == refused);
  if (after.tensors() == 1) CHECK(after.reserved_parameter_bytes() == reserved);
  auto [values, version] = shard.Read();
  CHECK(version == 0);
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
