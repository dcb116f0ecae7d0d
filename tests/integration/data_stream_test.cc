// The fast data path (PullStream / PushStream, common/fast_frame.h) against
// real ps_server processes: malformed frames are refused with nothing
// applied while the stream goes on, payloads may arrive in any slicing,
// pushes may arrive out of order and retries are de-duplicated, a waiting
// pull does not hold up the stream, bfloat16 on the wire rounds exactly as
// documented, and a sequence of pushes and pulls gives bit-identical
// parameters and versions on the streams and the protobuf RPCs.
#include "client/data_stream.h"

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "client/ps_client.h"
#include "common/fast_frame.h"
#include "common/net.h"
#include "common/payload.h"
#include "common/shard_map.h"
#include "common/tensor_layout.h"
#include "proto/asyncps.grpc.pb.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/stream_helpers.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/tcp_proxy.h"

namespace asyncps {
namespace {

using testing::Exchange;
using testing::Floats;
using testing::FrameBytes;
using testing::Sliced;
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
struct Shard : testing::OneTensorShard {
  PushResponse PushFrame(uint64_t id, const grpc::ByteBuffer& frame) {
    return streams->PushFrame(id, frame);
  }

  // Values and version of "w" through PullStream.
  std::pair<std::vector<float>, uint64_t> Read(WireDtype dtype = WIRE_F32) {
    PullRequest req;
    req.mutable_worker()->set_worker_id(9);
    req.mutable_worker()->set_incarnation(1);
    req.add_tensors("w");
    req.set_request_id(77);
    req.set_wire_dtype(dtype);
    grpc::ByteBuffer answer =
        Exchange(streams->pulls(), 77, SerializeToByteBuffer(req));
    FrameReader reader;
    PullResponse header;
    REQUIRE_OK(reader.Open(answer, &header));
    REQUIRE(header.status().code() == 0);
    REQUIRE(header.slices_size() == 1);
    REQUIRE(header.slices(0).values().empty());
    REQUIRE(header.slices(0).payload_bytes() == kElems * WireBytes(dtype));
    std::vector<float> v(kElems);
    REQUIRE_OK(
        reader.DecodeNext(header.slices(0).payload_bytes(), dtype, v.data()));
    REQUIRE(reader.remaining() == 0);
    return {v, header.slices(0).version()};
  }

  Counters GetCounters() {
    StatusResponse r;
    REQUIRE(stub->Status(Context().get(), StatusRequest(), &r).ok());
    return r.counters();
  }
};

Shard StartOne() { return Shard{testing::StartOneTensorShard(kElems)}; }

PushRequest Header(uint64_t seq, uint64_t grad_bytes, uint64_t id,
                   WireDtype dtype = WIRE_F32) {
  PushRequest req;
  req.mutable_worker()->set_worker_id(0);
  req.mutable_worker()->set_incarnation(1);
  req.set_seq(seq);
  req.set_request_id(id);
  req.set_wire_dtype(dtype);
  SliceGradient* g = req.add_grads();
  g->set_tensor("w");
  g->set_slice(0);
  g->set_grad_bytes(grad_bytes);
  return req;
}

TEST_CASE(
    "malformed PushStream frames are INVALID_ARGUMENT, change nothing, "
    "and the stream goes on",
    "[stream][bad_input]") {
  Shard shard = StartOne();
  const std::string good = Floats(std::vector<float>(kElems, 0.5f));
  std::vector<float> with_nan(kElems, 0.5f);
  with_nan[7] = std::nanf("");
  const uint64_t n = kElems * sizeof(float);

  struct Case {
    const char* what;
    std::string bytes;
    uint64_t id;  // the request id the answer carries (0: unreadable)
  };
  PushRequest in_grad = Header(1, 0, 10);
  in_grad.mutable_grads(0)->set_grad(good);
  const std::string huge_length("\xff\xff\xff\x7f", 4);
  const std::vector<Case> cases = {
      {"empty message", "", 0},
      {"length prefix cut short", std::string("\x05\x00", 2), 0},
      {"header length beyond the buffer", huge_length + "abc", 0},
      {"garbage header",
       std::string("\x05\x00\x00\x00", 4) + std::string(60, '\xff') + good, 0},
      {"payload shorter than grad_bytes",
       FrameBytes(Header(1, n, 11), good.substr(4)), 11},
      {"grad_bytes not the slice size",
       FrameBytes(Header(1, n - 4, 12), good.substr(4)), 12},
      {"grad_bytes not a multiple of 4",
       FrameBytes(Header(1, n - 2, 13), good.substr(2)), 13},
      {"payload beyond grad_bytes", FrameBytes(Header(1, n, 14), good + "xxxx"),
       14},
      {"gradient inside the header", FrameBytes(in_grad, ""), 10},
      {"NaN split across slices",
       FrameBytes(Header(1, n, 15), Floats(with_nan)), 15},
      {"unknown wire type",
       FrameBytes(Header(1, n, 16, static_cast<WireDtype>(9)), good), 16},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    const PushResponse r = shard.PushFrame(c.id, Sliced(c.bytes, 3));
    CHECK(r.status().code() ==
          static_cast<int>(absl::StatusCode::kInvalidArgument));
    CHECK_FALSE(r.status().message().empty());
    CHECK(r.results_size() == 0);
  }
  // Nothing applied, and the same stream still applies a good frame.
  auto [values, version] = shard.Read();
  CHECK(version == 0);
  CHECK(values == std::vector<float>(kElems, 1.0f));
  const Counters c = shard.GetCounters();
  CHECK(c.rejected_bad_input() == cases.size());
  CHECK(c.updates_applied() == 0);

  const PushResponse r =
      shard.PushFrame(20, Sliced(FrameBytes(Header(1, n, 20), good), 7));
  CHECK(r.status().code() == 0);
  std::tie(values, version) = shard.Read();
  CHECK(version == 1);
  CHECK(values == std::vector<float>(kElems, 0.5f));
}

TEST_CASE("a garbage pull on the stream is answered and the stream goes on",
          "[stream][bad_input]") {
  Shard shard = StartOne();
  grpc::ByteBuffer answer =
      Exchange(shard.streams->pulls(), 0, Sliced("\xff\xff\xff", 1));
  PullResponse header;
  FrameReader reader;
  REQUIRE_OK(reader.Open(answer, &header));
  CHECK(header.status().code() ==
        static_cast<int>(absl::StatusCode::kInvalidArgument));
  auto [values, version] = shard.Read();
  CHECK(version == 0);
}

TEST_CASE(
    "a frame in many slices applies like one piece; retries and "
    "out-of-order pushes are each applied once",
    "[stream][dedup]") {
  Shard shard = StartOne();
  std::vector<float> g(kElems);
  for (int64_t i = 0; i < kElems; ++i) g[i] = 0.25f * static_cast<float>(i);
  const std::string frame =
      FrameBytes(Header(7, kElems * sizeof(float), 1), Floats(g));
  for (size_t piece : {1, 3, 5, 1 << 20}) {
    INFO("slices of " << piece << " bytes");
    const PushResponse r = shard.PushFrame(1, Sliced(frame, piece));
    // The first delivery applies; every later one is a retry of seq 7.
    CHECK(r.duplicate() == (piece != 1));
    REQUIRE(r.results_size() == (piece == 1 ? 1 : 0));
    auto [values, version] = shard.Read();
    CHECK(version == 1);
    for (int64_t i = 0; i < kElems; ++i) CHECK(values[i] == 1.0f - g[i]);
  }
  // Seqs 10, 8, 9 arrive in that order: all new, all applied.
  const std::string ones = Floats(std::vector<float>(kElems, 1.0f));
  for (uint64_t seq : {10, 8, 9}) {
    const PushResponse r = shard.PushFrame(
        seq, Sliced(FrameBytes(Header(seq, kElems * sizeof(float), seq), ones),
                    1 << 20));
    CHECK_FALSE(r.duplicate());
  }
  auto [values, version] = shard.Read();
  CHECK(version == 4);
  const Counters c = shard.GetCounters();
  CHECK(c.pushes() == 7);
  CHECK(c.duplicate_pushes() == 3);
  CHECK(c.updates_applied() == 4);
}

TEST_CASE(
    "bfloat16 on the wire: gradients and pulled values round as "
    "documented",
    "[stream][bf16]") {
  Shard shard = StartOne();
  // 1/3 is not a bfloat16: it travels as its nearest bfloat16.
  std::vector<float> g(kElems, 1.0f / 3.0f);
  std::string payload(kElems * 2, '\0');
  EncodeBf16(g.data(), g.size(), payload.data());
  const PushResponse r = shard.PushFrame(
      3, Sliced(FrameBytes(Header(1, kElems * 2, 3, WIRE_BF16), payload), 5));
  REQUIRE(r.status().code() == 0);
  const float sent = FloatFromBf16(Bf16FromFloat(1.0f / 3.0f));
  CHECK(sent != 1.0f / 3.0f);
  auto [values, version] = shard.Read();
  for (float v : values) CHECK(v == 1.0f - sent);  // float32 on the shard
  auto [rounded, version2] = shard.Read(WIRE_BF16);
  for (float v : rounded) {
    CHECK(v == FloatFromBf16(Bf16FromFloat(1.0f - sent)));
  }
  CHECK(version2 == version);
}

TEST_CASE("a pull that waits does not hold up the next one on its stream",
          "[stream][ssp]") {
  auto server = StartPsServer(0, 1,
                              {"--log_level=warn", "--consistency=bsp",
                               "--pull_wait_timeout_ms=20000"});
  REQUIRE_OK(server.status());
  PsClientOptions o;
  o.servers = {server->address};
  o.connections_per_shard = 1;  // both pulls on one stream
  auto client = PsClient::Connect(o);
  REQUIRE_OK(client.status());
  TensorSpec spec;
  spec.set_name("w");
  spec.add_shape(4);
  spec.mutable_optimizer()->set_learning_rate(1);
  REQUIRE_OK((*client)->CreateTensors({spec}));
  REQUIRE_OK((*client)->Register().status());
  std::vector<float> a(4), b(4);
  // Answered at once: the stream then awaits nothing, and the waiting pull
  // below goes out with the read of its answer (DataStream's exchange).
  REQUIRE_OK((*client)->StartPull(0, 0, {{"w", b.data()}})->Wait());
  // For clock 1 under BSP: waits until this worker finished step 0.
  auto waiting = (*client)->StartPull(0, 1, {{"w", a.data()}});
  auto ready = (*client)->StartPull(0, 0, {{"w", b.data()}});
  REQUIRE_OK(ready->Wait());  // answered while the first one waits
  // Held behind the waiting pull, it would be answered only once that one
  // had given up (the shard's 20 s wait).
  absl::StatusOr<std::vector<StatusResponse>> status = (*client)->Status();
  REQUIRE_OK(status.status());
  CHECK(status->at(0).counters().pull_wait_timeouts() == 0);
  std::vector<float> grad(4, 1.0f);
  REQUIRE_OK((*client)
                 ->StartPush(0, {{"w", grad.data()}}, ready->read())
                 ->Wait()
                 .status());
  REQUIRE_OK(waiting->Wait());
  CHECK(waiting->read().versions.at("w")[0] == 1);
  CHECK(a == std::vector<float>(4, -1.0f));
}

// A stream posts the read of an answer with its request (an exchange), so
// that gRPC's window update for the read rides in the request's write
// instead of a write of its own after every answer; and a stream whose
// connection died while no answer was awaited sends its next request on a
// new one without the caller seeing an error.
TEST_CASE(
    "one write per request when idle, and a lost idle stream is "
    "replaced unseen",
    "[stream]") {
  Shard shard = StartOne();
  absl::StatusOr<std::unique_ptr<testing::TcpProxy>> proxy =
      testing::TcpProxy::Start(shard.server.address);
  REQUIRE_OK(proxy.status());
  testing::ShardStreams streams(MakeChannel((*proxy)->address()));
  PullRequest req;
  req.mutable_worker()->set_worker_id(9);
  req.mutable_worker()->set_incarnation(1);
  req.add_tensors("w");
  const auto pull = [&] {
    const PullResponse r = streams.Pull(req);
    REQUIRE(r.status().code() == 0);
    REQUIRE(r.slices_size() == 1);
    CHECK(r.slices(0).values().size() == kElems * sizeof(float));
  };
  pull();  // connects
  const uint64_t work0 = (*proxy)->client_work_frames();
  const uint64_t idle0 = (*proxy)->client_idle_only_reads();
  constexpr int kPulls = 50;
  for (int i = 0; i < kPulls; ++i) {
    pull();
    // A pause between calls, as a training step's compute: a window update
    // written after the answer would reach the proxy alone.
    absl::SleepFor(absl::Milliseconds(2));
  }
  CHECK((*proxy)->client_work_frames() - work0 >= kPulls);
  // Pings may go alone (at most a few in this time); a window update after
  // every answer made kPulls of them.
  CHECK((*proxy)->client_idle_only_reads() - idle0 <= 5);

  // The connection dies while the stream awaits nothing: the next pulls are
  // answered, the first on a new stream the caller never sees fail.
  (*proxy)->ResetAll();
  for (int i = 0; i < 3; ++i) pull();
  CHECK((*proxy)->connections() == 2);
  CHECK(shard.GetCounters().rejected_bad_input() == 0);
}

// The same pushes and pulls through PsClient (the streams) and through the
// protobuf RPCs, against a fresh 2-shard cluster each; every pulled value,
// version and push outcome in order.
struct Trace {
  std::vector<float> values;
  std::vector<uint64_t> versions;
  std::vector<int64_t> outcomes;
  std::vector<Counters> counters;
};

std::vector<TensorSpec> TraceSpecs() {
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
  return specs;
}

// A worker that speaks the protobuf Pull / Push RPCs to every shard, cutting
// tensors into slices by their home shard like PsClient does.
class ProtoWorker {
 public:
  explicit ProtoWorker(const std::vector<testing::ServerProcess>& shards) {
    for (const auto& s : shards) {
      stubs_.push_back(ParameterServer::NewStub(MakeChannel(s.address)));
    }
  }
  void Create(const std::vector<TensorSpec>& specs) {
    CreateTensorRequest req;
    for (const TensorSpec& s : specs) *req.add_tensors() = s;
    for (auto& stub : stubs_) {
      CreateTensorResponse resp;
      REQUIRE(stub->CreateTensor(Context().get(), req, &resp).ok());
      for (const TensorSpec& s : resp.tensors()) {
        layouts_.insert_or_assign(s.name(), *TensorLayout::FromSpec(s));
      }
    }
  }
  void Pull(int64_t clock,
            const std::vector<std::pair<std::string, float*>>& outs) {
    for (size_t s = 0; s < stubs_.size(); ++s) {
      PullRequest req;
      *req.mutable_worker() = Ref(clock);
      for (const auto& [name, out] : outs) req.add_tensors(name);
      PullResponse resp;
      REQUIRE(stubs_[s]->Pull(Context().get(), req, &resp).ok());
      for (const SliceData& d : resp.slices()) {
        float* out = nullptr;
        for (const auto& [name, o] : outs) {
          if (name == d.tensor()) out = o;
        }
        const TensorLayout& l = layouts_.at(d.tensor());
        DecodeFloats(d.values(), out + l.SliceBegin(d.slice()),
                     l.SliceSize(d.slice()));
        versions_[d.tensor()].resize(l.num_slices());
        versions_[d.tensor()][d.slice()] = d.version();
      }
    }
  }
  PushSummary Push(
      int64_t clock,
      const std::vector<std::pair<std::string, const float*>>& grads) {
    ++seq_;
    PushSummary summary;
    for (size_t s = 0; s < stubs_.size(); ++s) {
      PushRequest req;
      *req.mutable_worker() = Ref(clock);
      req.set_seq(seq_);
      for (const auto& [name, g] : grads) {
        const TensorLayout& l = layouts_.at(name);
        for (uint32_t i = 0; i < l.num_slices(); ++i) {
          if (ShardMap::Static(static_cast<int>(stubs_.size()))
                  ->SliceHome(name, i) != static_cast<int>(s)) {
            continue;
          }
          SliceGradient* sg = req.add_grads();
          sg->set_tensor(name);
          sg->set_slice(i);
          sg->set_read_version(versions_[name].empty() ? 0
                                                       : versions_[name][i]);
          EncodeFloats(g + l.SliceBegin(i), l.SliceSize(i), sg->mutable_grad());
        }
      }
      PushResponse resp;
      REQUIRE(stubs_[s]->Push(Context().get(), req, &resp).ok());
      for (const SliceResult& r : resp.results()) {
        if (r.outcome() == APPLIED) ++summary.applied;
        if (r.outcome() == REFUSED_STALE) ++summary.refused_stale;
        summary.max_staleness = std::max(summary.max_staleness, r.staleness());
      }
    }
    return summary;
  }
  std::vector<uint64_t> Versions(const std::string& name) {
    return versions_[name];
  }
  std::vector<Counters> AllCounters() {
    std::vector<Counters> out;
    for (auto& stub : stubs_) {
      StatusResponse r;
      REQUIRE(stub->Status(Context().get(), StatusRequest(), &r).ok());
      out.push_back(r.counters());
    }
    return out;
  }

 private:
  static WorkerRef Ref(int64_t clock) {
    WorkerRef ref;
    ref.set_worker_id(3);
    ref.set_incarnation(11);
    ref.set_clock(clock);
    return ref;
  }
  std::vector<std::unique_ptr<ParameterServer::Stub>> stubs_;
  absl::flat_hash_map<std::string, TensorLayout> layouts_;
  absl::flat_hash_map<std::string, std::vector<uint64_t>> versions_;
  uint64_t seq_ = 0;
};

// Runs the sequence on `worker` (PsClient or ProtoWorker).
template <typename Worker>
Trace RunSequence(Worker& worker) {
  Trace trace;
  std::vector<float> a(1000), b(37), ga(1000), gb(37);
  for (int step = 0; step < 6; ++step) {
    // Pull only on even steps: odd steps push stale gradients (staleness
    // scaling), and the last ones exceed max_staleness (refusals).
    if (step % 2 == 0 || step == 5) {
      worker.Pull(step, {{"a", a.data()}, {"b", b.data()}});
      trace.values.insert(trace.values.end(), a.begin(), a.end());
      trace.values.insert(trace.values.end(), b.begin(), b.end());
      for (const char* name : {"a", "b"}) {
        for (uint64_t v : worker.Versions(name)) trace.versions.push_back(v);
      }
    }
    for (size_t i = 0; i < ga.size(); ++i) ga[i] = std::sin(0.1f * i + step);
    for (size_t i = 0; i < gb.size(); ++i) gb[i] = 0.01f * (i + step);
    const int repeats = step == 3 ? 3 : 1;  // pushes without pulls in between
    for (int r = 0; r < repeats; ++r) {
      const PushSummary summary =
          worker.Push(step, {{"a", ga.data()}, {"b", gb.data()}});
      trace.outcomes.push_back(summary.applied);
      trace.outcomes.push_back(summary.refused_stale);
      trace.outcomes.push_back(static_cast<int64_t>(summary.max_staleness));
    }
  }
  worker.Pull(9, {{"a", a.data()}, {"b", b.data()}});
  trace.values.insert(trace.values.end(), a.begin(), a.end());
  trace.values.insert(trace.values.end(), b.begin(), b.end());
  trace.counters = worker.AllCounters();
  return trace;
}

// PsClient in the shape RunSequence wants.
struct StreamWorker {
  std::unique_ptr<PsClient> client;
  void Pull(int64_t clock,
            const std::vector<std::pair<std::string, float*>>& outs) {
    REQUIRE_OK(client->Pull(clock, outs));
  }
  PushSummary Push(int64_t clock,
                   const std::vector<std::pair<std::string, const float*>>& g) {
    absl::StatusOr<PushSummary> s = client->Push(clock, g);
    REQUIRE_OK(s.status());
    return *s;
  }
  std::vector<uint64_t> Versions(const std::string& name) {
    return client->PulledVersions(name);
  }
  std::vector<Counters> AllCounters() {
    auto status = client->Status();
    REQUIRE_OK(status.status());
    std::vector<Counters> out;
    for (const StatusResponse& s : *status) out.push_back(s.counters());
    return out;
  }
};

std::vector<testing::ServerProcess> TraceCluster() {
  auto cluster = StartPsCluster(
      2, {"--log_level=warn", "--staleness_lr=inverse", "--max_staleness=2"});
  REQUIRE_OK(cluster.status());
  return *std::move(cluster);
}

TEST_CASE("streams and protobuf RPCs give identical parameters and versions",
          "[stream][sharding]") {
  Trace streams, protobuf;
  {
    std::vector<testing::ServerProcess> cluster = TraceCluster();
    PsClientOptions options;
    options.servers = {cluster[0].address, cluster[1].address};
    options.worker_id = 3;
    options.incarnation = 11;
    auto client = PsClient::Connect(options);
    REQUIRE_OK(client.status());
    REQUIRE_OK((*client)->CreateTensors(TraceSpecs()));
    StreamWorker worker{*std::move(client)};
    streams = RunSequence(worker);
  }
  {
    std::vector<testing::ServerProcess> cluster = TraceCluster();
    ProtoWorker worker(cluster);
    worker.Create(TraceSpecs());
    protobuf = RunSequence(worker);
  }
  REQUIRE(streams.values.size() == protobuf.values.size());
  CHECK(std::memcmp(streams.values.data(), protobuf.values.data(),
                    streams.values.size() * sizeof(float)) == 0);
  CHECK(streams.versions == protobuf.versions);
  CHECK(streams.outcomes == protobuf.outcomes);
  // Some pushes were stale enough to be refused, so the rule was exercised.
  int64_t refused = 0;
  for (size_t i = 1; i < streams.outcomes.size(); i += 3) {
    refused += streams.outcomes[i];
  }
  CHECK(refused > 0);
  REQUIRE(streams.counters.size() == 2);
  for (size_t s = 0; s < 2; ++s) {
    INFO("shard " << s);
    const Counters& f = streams.counters[s];
    const Counters& p = protobuf.counters[s];
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
