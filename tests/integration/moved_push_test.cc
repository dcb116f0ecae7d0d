// A push part whose answer was lost at a shard that psctl scale then
// drained (PushRequest.moved_from): real ps_server processes. The client
// sends the part to the slots' new owner naming the drained shard, instead
// of retrying a stopped process until its deadline; the new owner applies
// it unless the drained shard had (the applied seqs travel with the move,
// and with the new owner's checkpoint).
#include <signal.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/ps_client.h"
#include "common/net.h"
#include "common/shard_map.h"
#include "proto/asyncps.grpc.pb.h"
#include "tests/integration/ledger_trainer.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/tensor_specs.h"

namespace asyncps {
namespace {

using testing::Psctl;
using testing::ServerProcess;

constexpr int kElems = 64;
constexpr int kSliceElems = 4;
constexpr int kSlices = kElems / kSliceElems;
const std::vector<std::string> kFlags = {"--num_slots=8"};

TensorSpec Spec() {
  return testing::ConstantSpec("w", {kElems}, 0.0f, testing::SgdSpec(1.0f),
                               kSliceElems);
}

// The slices of "w" that shard 1 owns under the run's starting map.
std::vector<uint32_t> SlicesOfShard1() {
  const ShardMap map = ShardMap::EvenSlots(2, 8).value();
  std::vector<uint32_t> out;
  for (uint32_t i = 0; i < kSlices; ++i) {
    if (map.SliceHome("w", i) == 1) out.push_back(i);
  }
  return out;
}

// Raw calls as worker 7 (incarnation 77), so that the test sets every
// field of a push and sees every answer.
class RawWorker {
 public:
  explicit RawWorker(const std::string& address)
      : stub_(ParameterServer::NewStub(MakeChannel(address))) {}

  // A gradient of 1 for each of `slices`, under `seq`, routed with
  // `epoch`, naming `origins` (shard, seq).
  grpc::Status Push(uint64_t seq, uint64_t epoch,
                    const std::vector<uint32_t>& slices,
                    const std::vector<std::pair<uint32_t, uint64_t>>& origins,
                    PushResponse* response) {
    PushRequest request;
    request.mutable_worker()->set_worker_id(7);
    request.mutable_worker()->set_incarnation(77);
    request.set_seq(seq);
    request.set_map_epoch(epoch);
    const std::vector<float> grad(kSliceElems, 1.0f);
    for (const uint32_t slice : slices) {
      SliceGradient* g = request.add_grads();
      g->set_tensor("w");
      g->set_slice(slice);
      g->set_grad(reinterpret_cast<const char*>(grad.data()),
                  grad.size() * sizeof(float));
    }
    for (const auto& [shard, origin_seq] : origins) {
      PushOrigin* o = request.add_moved_from();
      o->set_shard(shard);
      o->set_seq(origin_seq);
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    return stub_->Push(&ctx, request, response);
  }

  // Every element of "w" the shard holds, by slice (a reader's pull).
  std::vector<float> Values(uint64_t epoch) {
    PullRequest request;
    request.set_read_only(true);
    request.set_map_epoch(epoch);
    request.add_tensors("w");
    PullResponse response;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    const grpc::Status s = stub_->Pull(&ctx, request, &response);
    INFO(s.error_message());
    REQUIRE(s.ok());
    std::vector<float> out(kElems, 0.0f / 0.0f);
    for (const SliceData& d : response.slices()) {
      REQUIRE(d.values().size() == kSliceElems * sizeof(float));
      std::memcpy(&out[d.slice() * kSliceElems], d.values().data(),
                  d.values().size());
    }
    return out;
  }

  uint64_t MapEpoch() {
    StatusResponse response;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    REQUIRE(stub_->Status(&ctx, StatusRequest(), &response).ok());
    return response.map().epoch();
  }

 private:
  std::unique_ptr<ParameterServer::Stub> stub_;
};

// Elements of `values` on `slices` that are not `on`, and elsewhere not
// `off`.
int Wrong(const std::vector<float>& values, const std::vector<uint32_t>& slices,
          float on, float off) {
  int wrong = 0;
  for (uint32_t i = 0; i < kSlices; ++i) {
    const bool moved =
        std::find(slices.begin(), slices.end(), i) != slices.end();
    for (int e = 0; e < kSliceElems; ++e) {
      wrong += values[i * kSliceElems + e] != (moved ? on : off);
    }
  }
  return wrong;
}

void Kill(ServerProcess* p) {
  REQUIRE_OK(p->process->Signal(SIGKILL));
  absl::StatusOr<int> code = p->process->Wait(absl::Seconds(10));
  REQUIRE_OK(code.status());
  CHECK(*code == -SIGKILL);
}

// Worker 0 on `cluster`, its calls given 40 s: a part retried at a killed
// shard fails the call at that deadline.
std::unique_ptr<PsClient> Connect(const std::vector<ServerProcess>& cluster) {
  PsClientOptions o;
  for (const ServerProcess& p : cluster) o.servers.push_back(p.address);
  o.worker_id = 0;
  o.retry.call_deadline = absl::Seconds(40);
  std::unique_ptr<PsClient> c = PsClient::Connect(o).value();
  REQUIRE_OK(c->WaitForShards(absl::Seconds(30)));
  return c;
}

TEST_CASE(
    "a push part sent to a shard that is drained and killed before it "
    "answers goes to the slots' new owner and is applied once",
    "[slots][scale][exactly-once]") {
  auto cluster = testing::StartPsCluster(2, kFlags);
  REQUIRE_OK(cluster.status());
  std::unique_ptr<PsClient> c = Connect(*cluster);
  REQUIRE_OK(c->CreateTensors({Spec()}));
  std::vector<float> values(kElems);
  REQUIRE_OK(c->Pull(0, {{"w", values.data()}}));
  const std::vector<float> ones(kElems, 1.0f);
  REQUIRE_OK(c->Push(0, {{"w", ones.data()}}).status());

  // Shard 1's slots go to shard 0; the client still routes by the map of
  // two shards. Shard 1 is frozen, so the part the next push sends it is
  // never answered, then killed.
  const std::string servers = "--servers=" + testing::ServerList(*cluster);
  const auto [code, out] = Psctl({"scale", servers, "--shards=1"});
  INFO(out);
  REQUIRE(code == 0);
  REQUIRE_OK((*cluster)[1].process->Signal(SIGSTOP));
  const std::vector<float> twos(kElems, 2.0f);
  std::unique_ptr<PsClient::PendingPush> push =
      c->StartPush(1, PushSet{{{"w", twos.data()}}, {}}, c->LastRead());
  absl::SleepFor(absl::Milliseconds(500));
  Kill(&(*cluster)[1]);
  absl::StatusOr<PushSummary> pushed = push->Wait();
  REQUIRE_OK(pushed.status());
  CHECK(pushed->duplicates == 0);
  CHECK(c->map().serving_shards() == std::vector<int>{0});

  REQUIRE_OK(c->Pull(2, {{"w", values.data()}}));
  int wrong = 0;
  for (float v : values) wrong += v != -3.0f;
  CHECK(wrong == 0);
}

TEST_CASE(
    "drained shards killed (SIGKILL) as soon as a scale down returns, while "
    "a worker trains, cost no error and no acknowledged push",
    "[slots][scale][ledger]") {
  auto cluster = testing::StartPsCluster(3, {"--num_slots=64"});
  REQUIRE_OK(cluster.status());
  std::unique_ptr<PsClient> c = Connect(*cluster);
  testing::LedgerTrainer t;
  t.Start(c.get());
  const std::string servers = "--servers=" + testing::ServerList(*cluster);
  for (const int m : {2, 1}) {
    const int64_t before = t.acked.load();
    t.WaitForPushes(before, 10);
    const auto [code, out] =
        Psctl({"scale", servers, absl::StrCat("--shards=", m)});
    INFO(out);
    REQUIRE(code == 0);
    Kill(&(*cluster)[m]);
  }
  const int64_t before = t.acked.load();
  t.WaitForPushes(before, 20);
  t.Stop();
  REQUIRE_OK(t.error);
  CHECK(t.acked.load() >= before + 20);
  CHECK(c->map().serving_shards() == std::vector<int>{0});
  INFO("acknowledged pushes " << t.acked.load());
  CHECK(testing::LedgerWrong(c.get(), t.ids, t.acked.load()) == 0);
}

TEST_CASE(
    "a pull bound only for a drained shard that was killed asks another "
    "shard for the map and reads from the new owner",
    "[slots][scale]") {
  auto cluster = testing::StartPsCluster(2, kFlags);
  REQUIRE_OK(cluster.status());
  // A one-slice tensor that shard 1 holds: no other shard has a part of
  // a pull of it that could refuse it with the newer map.
  const ShardMap start = ShardMap::EvenSlots(2, 8).value();
  std::string name;
  for (int i = 0; name.empty(); ++i) {
    if (start.SliceHome(absl::StrCat("solo", i), 0) == 1) {
      name = absl::StrCat("solo", i);
    }
  }
  std::unique_ptr<PsClient> c = Connect(*cluster);
  REQUIRE_OK(c->CreateTensors({testing::ConstantSpec(
      name, {kSliceElems}, 3.0f, testing::SgdSpec(1.0f), kSliceElems)}));
  const auto [code, out] = Psctl(
      {"scale", "--servers=" + testing::ServerList(*cluster), "--shards=1"});
  INFO(out);
  REQUIRE(code == 0);
  Kill(&(*cluster)[1]);
  std::vector<float> values(kSliceElems);
  REQUIRE_OK(c->Pull(0, {{name, values.data()}}));
  CHECK(values == std::vector<float>(kSliceElems, 3.0f));
  CHECK(c->map().serving_shards() == std::vector<int>{0});
}

TEST_CASE(
    "a re-routed push part is a duplicate exactly when its origin applied "
    "it, also at a new owner restarted from its files",
    "[slots][scale][exactly-once][bad-input]") {
  const std::string dir = testing::MakeTmpDir("moved-push");
  std::vector<std::string> flags = kFlags;
  flags.push_back(absl::StrCat("--checkpoint_dir=", dir));
  auto cluster = testing::StartPsCluster(2, flags);
  REQUIRE_OK(cluster.status());
  {
    PsClientOptions o;
    for (const ServerProcess& p : *cluster) o.servers.push_back(p.address);
    std::unique_ptr<PsClient> creator = PsClient::Connect(o).value();
    REQUIRE_OK(creator->WaitForShards(absl::Seconds(30)));
    REQUIRE_OK(creator->CreateTensors({Spec()}));
  }
  const std::vector<uint32_t> moved = SlicesOfShard1();
  REQUIRE(!moved.empty());
  RawWorker one((*cluster)[1].address);
  PushResponse r;
  REQUIRE(one.Push(5, ShardMap::kStaticEpoch, moved, {}, &r).ok());
  CHECK_FALSE(r.duplicate());

  const std::string servers = "--servers=" + testing::ServerList(*cluster);
  const auto [code, out] = Psctl({"scale", servers, "--shards=1"});
  INFO(out);
  REQUIRE(code == 0);
  RawWorker zero((*cluster)[0].address);
  const uint64_t epoch = zero.MapEpoch();
  REQUIRE(epoch > ShardMap::kStaticEpoch);

  // Seq 5 reached shard 1 (applied there, moved here): a duplicate.
  REQUIRE(zero.Push(6, epoch, moved, {{1, 5}}, &r).ok());
  CHECK(r.duplicate());
  CHECK(Wrong(zero.Values(epoch), moved, -1.0f, 0.0f) == 0);
  // Seq 9 never did: applied here once, whatever the retries.
  REQUIRE(zero.Push(7, epoch, moved, {{1, 9}}, &r).ok());
  CHECK_FALSE(r.duplicate());
  REQUIRE(zero.Push(7, epoch, moved, {{1, 9}}, &r).ok());
  CHECK(r.duplicate());
  // An origin that is this shard: its own window answers (seq 7 applied).
  REQUIRE(zero.Push(8, epoch, moved, {{0, 7}}, &r).ok());
  CHECK(r.duplicate());
  CHECK(Wrong(zero.Values(epoch), moved, -2.0f, 0.0f) == 0);

  // Malformed origins: refused, nothing applied.
  const std::vector<std::pair<uint32_t, uint64_t>> nine(9, {1, 100});
  for (const auto& bad :
       std::vector<std::vector<std::pair<uint32_t, uint64_t>>>{
           nine, {{1, 0}}, {{70000, 3}}}) {
    const grpc::Status s = zero.Push(20, epoch, moved, bad, &r);
    INFO(s.error_message());
    CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(absl::StrContains(s.error_message(), "moved_from"));
  }
  CHECK(Wrong(zero.Values(epoch), moved, -2.0f, 0.0f) == 0);

  // Killed and restarted on its files, the new owner still knows what
  // shard 1 had applied.
  const auto [ck, ckout] =
      Psctl({"checkpoint", "--servers=" + (*cluster)[0].address});
  INFO(ckout);
  REQUIRE(ck == 0);
  Kill(&(*cluster)[0]);
  const std::string& address = (*cluster)[0].address;
  absl::StatusOr<ServerProcess> again =
      testing::StartPsServer(0, 2, flags, absl::Seconds(30),
                             std::stoi(address.substr(address.rfind(':') + 1)));
  REQUIRE_OK(again.status());
  (*cluster)[0] = *std::move(again);
  RawWorker restarted((*cluster)[0].address);
  REQUIRE(restarted.MapEpoch() == epoch);
  REQUIRE(restarted.Push(10, epoch, moved, {{1, 5}}, &r).ok());
  CHECK(r.duplicate());
  REQUIRE(restarted.Push(11, epoch, moved, {{1, 12}}, &r).ok());
  CHECK_FALSE(r.duplicate());
  CHECK(Wrong(restarted.Values(epoch), moved, -3.0f, 0.0f) == 0);
}

}  // namespace
}  // namespace asyncps
