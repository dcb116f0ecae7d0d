// The fast data path (PullFast / PushFast, common/fast_frame.h) against real
// ps_server processes: malformed frames are refused with nothing applied,
// payloads may arrive in any slicing, retries are de-duplicated, and a
// sequence of pushes and pulls gives bit-identical parameters and versions
// on the fast and the protobuf path.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "common/fast_frame.h"
#include "common/float_codec.h"
#include "common/net.h"
#include "proto/asyncps.grpc.pb.h"
#include "tests/testing/subprocess.h"
#include "worker/ps_client.h"

namespace asyncps {
namespace {

using testing::StartPsCluster;
using testing::StartPsServer;

constexpr int64_t kElems = 10;

std::unique_ptr<grpc::ClientContext> Context() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::seconds(10));
  return ctx;
}

// One shard holding "w": kElems floats, all 1, one slice, SGD with lr 1.
struct Shard {
  testing::ServerProcess server;
  std::unique_ptr<ParameterServer::Stub> stub;
  std::unique_ptr<grpc::GenericStub> generic;

  grpc::Status Call(const char* method, const grpc::ByteBuffer& request,
                    grpc::ByteBuffer* response) {
    auto ctx = Context();
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    grpc::Status status;
    generic->UnaryCall(ctx.get(), method, grpc::StubOptions(), &request,
                       response, [&](grpc::Status s) {
                         std::lock_guard<std::mutex> l(mu);
                         status = std::move(s);
                         done = true;
                         cv.notify_all();
                       });
    std::unique_lock<std::mutex> l(mu);
    REQUIRE(cv.wait_for(l, std::chrono::seconds(15), [&] { return done; }));
    return status;
  }

  // Values and version of "w" through PullFast.
  std::pair<std::vector<float>, uint64_t> ReadFast() {
    PullRequest req;
    req.mutable_worker()->set_worker_id(9);
    req.mutable_worker()->set_incarnation(1);
    req.add_tensors("w");
    grpc::ByteBuffer answer;
    REQUIRE(Call(kPullFastMethod, SerializeToByteBuffer(req), &answer).ok());
    FrameReader reader;
    PullResponse header;
    REQUIRE(reader.Open(answer, &header).ok());
    REQUIRE(header.slices_size() == 1);
    REQUIRE(header.slices(0).values().empty());
    REQUIRE(header.slices(0).payload_bytes() == kElems * sizeof(float));
    std::vector<float> v(kElems);
    REQUIRE(reader
                .CopyNext(header.slices(0).payload_bytes(),
                          reinterpret_cast<char*>(v.data()))
                .ok());
    REQUIRE(reader.remaining() == 0);
    return {v, header.slices(0).version()};
  }

  Counters GetCounters() {
    StatusResponse r;
    REQUIRE(stub->Status(Context().get(), StatusRequest(), &r).ok());
    return r.counters();
  }
};

Shard StartOne() {
  auto server = StartPsServer(0, 1, {"--log_level=warn"});
  REQUIRE(server.ok());
  Shard shard{*std::move(server), nullptr, nullptr};
  std::shared_ptr<grpc::Channel> channel = MakeChannel(shard.server.address);
  shard.stub = ParameterServer::NewStub(channel);
  shard.generic = std::make_unique<grpc::GenericStub>(channel);
  CreateTensorRequest create;
  TensorSpec* s = create.add_tensors();
  s->set_name("w");
  s->add_shape(kElems);
  s->set_init(INIT_CONSTANT);
  s->set_init_value(1.0f);
  s->set_slice_elems(kElems);
  s->mutable_optimizer()->set_type(OPT_SGD);
  s->mutable_optimizer()->set_learning_rate(1.0f);
  CreateTensorResponse created;
  REQUIRE(shard.stub->CreateTensor(Context().get(), create, &created).ok());
  return shard;
}

PushRequest Header(uint64_t seq, uint64_t grad_bytes) {
  PushRequest req;
  req.mutable_worker()->set_worker_id(0);
  req.mutable_worker()->set_incarnation(1);
  req.set_seq(seq);
  SliceGradient* g = req.add_grads();
  g->set_tensor("w");
  g->set_slice(0);
  g->set_grad_bytes(grad_bytes);
  return req;
}

// All of `bytes` as one buffer cut into slices of `piece` bytes.
grpc::ByteBuffer Sliced(const std::string& bytes, size_t piece) {
  std::vector<grpc::Slice> slices;
  for (size_t i = 0; i < bytes.size(); i += piece) {
    slices.emplace_back(bytes.data() + i, std::min(piece, bytes.size() - i));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// The bytes of a frame: a header and a payload.
std::string FrameBytes(const PushRequest& header, const std::string& payload) {
  grpc::ByteBuffer frame = MakeFrame(header, {});
  std::vector<grpc::Slice> slices;
  REQUIRE(frame.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out + payload;
}

std::string Floats(const std::vector<float>& v) {
  std::string out;
  EncodeFloats(v.data(), v.size(), &out);
  return out;
}

TEST_CASE("malformed PushFast frames are INVALID_ARGUMENT and change nothing",
          "[fast_path][bad_input]") {
  Shard shard = StartOne();
  const std::string good = Floats(std::vector<float>(kElems, 0.5f));
  std::vector<float> with_nan(kElems, 0.5f);
  with_nan[7] = std::nanf("");
  const uint64_t n = kElems * sizeof(float);

  struct Case {
    const char* what;
    std::string bytes;
  };
  PushRequest in_grad = Header(1, 0);
  in_grad.mutable_grads(0)->set_grad(good);
  const std::vector<Case> cases = {
      {"empty buffer", ""},
      {"header length beyond the buffer", std::string("\xe8\x07", 2) + "abc"},
      {"malformed length prefix", std::string(6, '\xff')},
      {"garbage header", std::string("\x05\xff\xff\xff\xff\xff", 6) + good},
      {"payload shorter than grad_bytes",
       FrameBytes(Header(1, n), good.substr(4))},
      {"grad_bytes not the slice size",
       FrameBytes(Header(1, n - 4), good.substr(4))},
      {"grad_bytes not a multiple of 4",
       FrameBytes(Header(1, n - 2), good.substr(2))},
      {"payload beyond grad_bytes", FrameBytes(Header(1, n), good + "xxxx")},
      {"gradient inside the header", FrameBytes(in_grad, "")},
      {"NaN split across slices", FrameBytes(Header(1, n), Floats(with_nan))},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    grpc::ByteBuffer answer;
    const grpc::Status s =
        shard.Call(kPushFastMethod, Sliced(c.bytes, 3), &answer);
    CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  }
  // Nothing applied, the worker was never registered, and the shard serves.
  auto [values, version] = shard.ReadFast();
  CHECK(version == 0);
  CHECK(values == std::vector<float>(kElems, 1.0f));
  const Counters c = shard.GetCounters();
  CHECK(c.rejected_bad_input() == cases.size());
  CHECK(c.pushes() == 0);
  CHECK(c.updates_applied() == 0);

  // A garbage PullFast request is refused too.
  grpc::ByteBuffer answer;
  CHECK(shard.Call(kPullFastMethod, Sliced("\xff\xff\xff", 1), &answer)
            .error_code() == grpc::StatusCode::INVALID_ARGUMENT);

  // The same shard still applies a good frame.
  REQUIRE(shard
              .Call(kPushFastMethod, Sliced(FrameBytes(Header(1, n), good), 7),
                    &answer)
              .ok());
  std::tie(values, version) = shard.ReadFast();
  CHECK(version == 1);
  CHECK(values == std::vector<float>(kElems, 0.5f));
}

TEST_CASE(
    "a PushFast frame in many slices applies like one piece, and its "
    "retry is de-duplicated",
    "[fast_path][dedup]") {
  Shard shard = StartOne();
  std::vector<float> g(kElems);
  for (int64_t i = 0; i < kElems; ++i) g[i] = 0.25f * static_cast<float>(i);
  const std::string frame =
      FrameBytes(Header(7, kElems * sizeof(float)), Floats(g));
  for (size_t piece : {1, 3, 5, 1 << 20}) {
    INFO("slices of " << piece << " bytes");
    grpc::ByteBuffer answer;
    REQUIRE(shard.Call(kPushFastMethod, Sliced(frame, piece), &answer).ok());
    PushResponse r;
    REQUIRE(ParseFromByteBuffer(answer, &r).ok());
    // The first delivery applies; every later one is a retry of seq 7.
    CHECK(r.duplicate() == (piece != 1));
    REQUIRE(r.results_size() == (piece == 1 ? 1 : 0));
    auto [values, version] = shard.ReadFast();
    CHECK(version == 1);
    for (int64_t i = 0; i < kElems; ++i) CHECK(values[i] == 1.0f - g[i]);
  }
  const Counters c = shard.GetCounters();
  CHECK(c.pushes() == 4);
  CHECK(c.duplicate_pushes() == 3);
  CHECK(c.updates_applied() == 1);
  CHECK(c.bytes_in() == 4 * kElems * sizeof(float));
}

// Runs the same pushes and pulls through a PsClient on the fast or the
// protobuf path against a fresh 2-shard cluster; returns every pulled value,
// version and push outcome in order.
struct Trace {
  std::vector<float> values;
  std::vector<uint64_t> versions;
  std::vector<int64_t> outcomes;
  std::vector<Counters> counters;
};

Trace RunSequence(bool fast_path) {
  auto cluster = StartPsCluster(
      2, {"--log_level=warn", "--staleness_lr=inverse", "--max_staleness=2"});
  REQUIRE(cluster.ok());
  PsClientOptions options;
  options.servers = {(*cluster)[0].address, (*cluster)[1].address};
  options.worker_id = 3;
  options.incarnation = 11;
  options.fast_path = fast_path;
  auto client = PsClient::Connect(options);
  REQUIRE(client.ok());

  std::vector<TensorSpec> specs(2);
  specs[0].set_name("a");
  specs[0].add_shape(1000);
  specs[0].set_init(INIT_UNIFORM);
  specs[0].set_init_value(0.5f);
  specs[0].set_seed(5);
  specs[0].set_slice_elems(64);
  specs[0].mutable_optimizer()->set_type(OPT_ADAM);
  specs[0].mutable_optimizer()->set_learning_rate(0.01f);
  specs[0].mutable_optimizer()->set_beta1(0.9f);
  specs[0].mutable_optimizer()->set_beta2(0.999f);
  specs[0].mutable_optimizer()->set_epsilon(1e-8f);
  specs[1].set_name("b");
  specs[1].add_shape(37);
  specs[1].set_init(INIT_CONSTANT);
  specs[1].set_init_value(2.0f);
  specs[1].set_slice_elems(8);
  specs[1].mutable_optimizer()->set_type(OPT_SGD);
  specs[1].mutable_optimizer()->set_learning_rate(0.1f);
  REQUIRE((*client)->CreateTensors(specs).ok());

  Trace trace;
  std::vector<float> a(1000), b(37), ga(1000), gb(37);
  for (int step = 0; step < 6; ++step) {
    // Pull only on even steps: odd steps push stale gradients (staleness
    // scaling), and the last ones exceed max_staleness (refusals).
    if (step % 2 == 0 || step == 5) {
      REQUIRE((*client)->Pull(step, {{"a", a.data()}, {"b", b.data()}}).ok());
      trace.values.insert(trace.values.end(), a.begin(), a.end());
      trace.values.insert(trace.values.end(), b.begin(), b.end());
      for (const char* name : {"a", "b"}) {
        for (uint64_t v : (*client)->PulledVersions(name)) {
          trace.versions.push_back(v);
        }
      }
    }
    for (size_t i = 0; i < ga.size(); ++i) ga[i] = std::sin(0.1f * i + step);
    for (size_t i = 0; i < gb.size(); ++i) gb[i] = 0.01f * (i + step);
    const int repeats = step == 3 ? 3 : 1;  // pushes without pulls in between
    for (int r = 0; r < repeats; ++r) {
      auto summary =
          (*client)->Push(step, {{"a", ga.data()}, {"b", gb.data()}});
      REQUIRE(summary.ok());
      trace.outcomes.push_back(summary->applied);
      trace.outcomes.push_back(summary->refused_stale);
      trace.outcomes.push_back(static_cast<int64_t>(summary->max_staleness));
    }
  }
  REQUIRE((*client)->Pull(9, {{"a", a.data()}, {"b", b.data()}}).ok());
  trace.values.insert(trace.values.end(), a.begin(), a.end());
  trace.values.insert(trace.values.end(), b.begin(), b.end());
  auto status = (*client)->Status();
  REQUIRE(status.ok());
  for (const StatusResponse& s : *status)
    trace.counters.push_back(s.counters());
  return trace;
}

TEST_CASE("fast and protobuf paths give identical parameters and versions",
          "[fast_path][sharding]") {
  const Trace fast = RunSequence(true);
  const Trace slow = RunSequence(false);
  REQUIRE(fast.values.size() == slow.values.size());
  CHECK(std::memcmp(fast.values.data(), slow.values.data(),
                    fast.values.size() * sizeof(float)) == 0);
  CHECK(fast.versions == slow.versions);
  CHECK(fast.outcomes == slow.outcomes);
  // Some pushes were stale enough to be refused, so the rule was exercised.
  int64_t refused = 0;
  for (size_t i = 1; i < fast.outcomes.size(); i += 3)
    refused += fast.outcomes[i];
  CHECK(refused > 0);
  REQUIRE(fast.counters.size() == 2);
  for (size_t s = 0; s < 2; ++s) {
    INFO("shard " << s);
    const Counters& f = fast.counters[s];
    const Counters& p = slow.counters[s];
    CHECK(f.pulls() == p.pulls());
    CHECK(f.pushes() == p.pushes());
    CHECK(f.updates_applied() == p.updates_applied());
    CHECK(f.refused_stale() == p.refused_stale());
    CHECK(f.scaled() == p.scaled());
    CHECK(f.bytes_in() == p.bytes_in());
    CHECK(f.bytes_out() == p.bytes_out());
    CHECK(f.rejected_bad_input() == 0);
  }
}

}  // namespace
}  // namespace asyncps
