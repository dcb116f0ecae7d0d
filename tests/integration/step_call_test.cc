// One pull and one push per step: a step's tensors and rows travel in one
// request per shard (PsClient::StartPull / StartPush with a PullSet /
// PushSet), share one sequence number, and each shard applies its part
// whole or not at all. Real ps_server processes on port 0.
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "client/ps_client.h"
#include "common/net.h"
#include "common/shard_map.h"
#include "proto/asyncps.grpc.pb.h"
#include "proto/asyncps.pb.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/stream_helpers.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/tensor_specs.h"

namespace asyncps {
namespace {

using testing::ConstantSpec;
using testing::ServerProcess;
using testing::SgdSpec;
using testing::StartPsCluster;

std::unique_ptr<PsClient> Connect(const std::vector<ServerProcess>& cluster,
                                  int32_t worker) {
  PsClientOptions o;
  for (const ServerProcess& s : cluster) o.servers.push_back(s.address);
  o.worker_id = worker;
  o.retry.call_deadline = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<PsClient>> c = PsClient::Connect(o);
  REQUIRE_OK(c.status());
  REQUIRE_OK((*c)->WaitForShards(absl::Seconds(30)));
  return *std::move(c);
}

// Each shard's (pulls, pushes) counters.
std::vector<std::pair<uint64_t, uint64_t>> Calls(PsClient* c) {
  absl::StatusOr<std::vector<StatusResponse>> st = c->Status();
  REQUIRE_OK(st.status());
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (const StatusResponse& s : *st) {
    out.emplace_back(s.counters().pulls(), s.counters().pushes());
  }
  return out;
}

TEST_CASE("a step's tensors and rows are one request per shard", "[step]") {
  auto cluster = StartPsCluster(2);
  REQUIRE_OK(cluster.status());
  auto c = Connect(*cluster, 0);
  // 8 elements in slices of 2: 4 slices, two on each shard.
  REQUIRE_OK(
      c->CreateTensors({ConstantSpec("w", {8}, 1.0f, SgdSpec(1.0f), 2)}));
  REQUIRE_OK(c->CreateTables({testing::ConstantTableSpec("emb", 2, 0.5f)}));
  REQUIRE_OK(c->Register().status());
  // Ids on both shards, one repeated.
  const ShardMap& map = c->map();
  std::vector<uint64_t> ids;
  for (uint64_t id = 1; ids.size() < 4; ++id) {
    if (map.RowHome("emb", id) == static_cast<int>(ids.size() % 2)) {
      ids.push_back(id);
    }
  }
  ids.push_back(ids[0]);

  const auto before = Calls(c.get());
  std::vector<float> w(8, -1.0f), emb(ids.size() * 2, -1.0f);
  auto pull = c->StartPull(
      0, 0, PullSet{{{"w", w.data()}}, {{"emb", ids, emb.data()}}});
  REQUIRE_OK(pull->Wait());
  CHECK(w == std::vector<float>(8, 1.0f));
  CHECK(emb == std::vector<float>(ids.size() * 2, 0.5f));
  REQUIRE(pull->read().versions.at("w").size() == 4);
  REQUIRE(pull->read().tables.count("emb") == 1);

  std::vector<float> gw(8, 0.25f), gemb(ids.size() * 2, 0.125f);
  absl::StatusOr<PushSummary> done =
      c->StartPush(0, PushSet{{{"w", gw.data()}}, {{"emb", ids, gemb.data()}}},
                   pull->read())
          ->Wait();
  REQUIRE_OK(done.status());
  CHECK(done->tensors.at("w").applied == 4);
  CHECK(done->rows.applied == 4);  // distinct ids
  CHECK(done->applied == 8);
  CHECK(done->duplicates == 0);

  // One pull request and one push request reached each shard.
  const auto after = Calls(c.get());
  REQUIRE(after.size() == 2);
  for (size_t s = 0; s < after.size(); ++s) {
    INFO("shard " << s);
    CHECK(after[s].first - before[s].first == 1);
    CHECK(after[s].second - before[s].second == 1);
  }

  // SGD with rate 1: w = 1 - 0.25; the repeated id's gradient is summed.
  pull = c->StartPull(0, 0,
                      PullSet{{{"w", w.data()}}, {{"emb", ids, emb.data()}}});
  REQUIRE_OK(pull->Wait());
  CHECK(w == std::vector<float>(8, 0.75f));
  CHECK(emb[0] == Approx(0.25f));  // ids[0] twice: 0.5 - 2 * 0.125
  CHECK(emb[2] == Approx(0.375f));
  CHECK(emb[8] == Approx(0.25f));  // the repeat reads the same row
  for (uint64_t v : pull->read().versions.at("w")) CHECK(v == 1);
  CHECK(pull->read().VersionOf("emb", ids[0]) == 1);
}

TEST_CASE(
    "a step whose rows do not fit applies none of its tensors on that "
    "shard",
    "[step][memory]") {
  // Room for about 3000 rows of dim 8 (SGD) on the one shard.
  auto cluster = StartPsCluster(1, {"--max_parameter_bytes=300K"});
  REQUIRE_OK(cluster.status());
  auto c = Connect(*cluster, 0);
  REQUIRE_OK(
      c->CreateTensors({ConstantSpec("w", {4}, 1.0f, SgdSpec(1.0f), 4)}));
  REQUIRE_OK(c->CreateTables({testing::ConstantTableSpec("big", 8, 0.0f)}));
  REQUIRE_OK(c->Register().status());

  std::vector<float> w(4);
  auto pull = c->StartPull(0, 0, PullSet{{{"w", w.data()}}, {}});
  REQUIRE_OK(pull->Wait());
  // 5000 new rows cannot be created: the whole step is refused.
  std::vector<uint64_t> ids(5000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i + 1;
  std::vector<float> gw(4, 0.5f), grows(ids.size() * 8, 0.01f);
  const absl::StatusOr<PushSummary> done =
      c->StartPush(0, PushSet{{{"w", gw.data()}}, {{"big", ids, grows.data()}}},
                   pull->read())
          ->Wait();
  INFO(done.status().ToString());
  REQUIRE(absl::IsResourceExhausted(done.status()));

  // Nothing of the step was applied: w keeps its values and version, and
  // the table has no rows.
  auto again = c->StartPull(0, 0, PullSet{{{"w", w.data()}}, {}});
  REQUIRE_OK(again->Wait());
  CHECK(w == std::vector<float>(4, 1.0f));
  CHECK(again->read().versions.at("w") == std::vector<uint64_t>{0});
  absl::StatusOr<std::vector<StatusResponse>> st = c->Status();
  REQUIRE_OK(st.status());
  CHECK((*st)[0].tables(0).rows() == 0);
  CHECK((*st)[0].counters().updates_applied() == 0);
}

TEST_CASE("a step's push is checked whole before anything is sent",
          "[step][bad_input]") {
  auto cluster = StartPsCluster(2);
  REQUIRE_OK(cluster.status());
  auto c = Connect(*cluster, 0);
  REQUIRE_OK(
      c->CreateTensors({ConstantSpec("w", {4}, 1.0f, SgdSpec(1.0f), 2)}));
  REQUIRE_OK(c->CreateTables({testing::ConstantTableSpec("emb", 2, 0.5f)}));
  REQUIRE_OK(c->Register().status());
  const auto before = Calls(c.get());
  std::vector<float> gw(4, 0.5f);
  const std::vector<uint64_t> ids = {1, 2};
  std::vector<float> nan = {0.1f, 0.1f, 0.1f, std::nanf("")};
  // A good tensor and a NaN row: INVALID_ARGUMENT, nothing sent.
  absl::Status s =
      c->StartPush(0, PushSet{{{"w", gw.data()}}, {{"emb", ids, nan.data()}}},
                   ReadSet())
          ->Wait()
          .status();
  CHECK(absl::IsInvalidArgument(s));
  // A good tensor and an unknown table: NOT_FOUND, nothing sent.
  std::vector<float> g(4, 0.1f);
  s = c->StartPush(0, PushSet{{{"w", gw.data()}}, {{"nope", ids, g.data()}}},
                   ReadSet())
          ->Wait()
          .status();
  CHECK(absl::IsNotFound(s));
  // An assign with a row twice: INVALID_ARGUMENT, nothing sent.
  const std::vector<uint64_t> twice = {3, 3};
  s = c->StartAssign(0, PushSet{{{"w", gw.data()}}, {{"emb", twice, g.data()}}})
          ->Wait()
          .status();
  CHECK(absl::IsInvalidArgument(s));
  const auto after = Calls(c.get());
  for (size_t i = 0; i < after.size(); ++i) {
    CHECK(after[i].second == before[i].second);
  }
}

TEST_CASE(
    "a request routed with a newer map epoch is refused before it is read",
    "[step][map]") {
  auto cluster = StartPsCluster(1);
  REQUIRE_OK(cluster.status());
  auto c = Connect(*cluster, 0);
  REQUIRE_OK(
      c->CreateTensors({ConstantSpec("w", {2}, 1.0f, SgdSpec(1.0f), 2)}));
  REQUIRE(c->map().epoch() == ShardMap::kStaticEpoch);
  const std::shared_ptr<grpc::Channel> channel =
      MakeChannel((*cluster)[0].address);
  auto stub = ParameterServer::NewStub(channel);
  testing::ShardStreams streams(channel);

  const auto push = [](uint64_t seq, uint64_t map_epoch) {
    PushRequest p;
    p.mutable_worker()->set_worker_id(7);
    p.mutable_worker()->set_incarnation(11);
    p.set_seq(seq);
    p.set_map_epoch(map_epoch);
    SliceGradient* g = p.add_grads();
    g->set_tensor("w");
    g->set_slice(0);
    const std::vector<float> grad = {0.5f, 0.5f};
    g->set_grad(std::string(reinterpret_cast<const char*>(grad.data()),
                            grad.size() * sizeof(float)));
    return p;
  };
  const auto pull = [](uint64_t map_epoch) {
    PullRequest p;
    p.mutable_worker()->set_worker_id(7);
    p.mutable_worker()->set_incarnation(11);
    p.add_tensors("w");
    p.set_map_epoch(map_epoch);
    return p;
  };
  // What the shard holds, read by nobody (a reader's pull registers no
  // worker).
  const auto version = [&]() {
    PullRequest read;
    read.set_read_only(true);
    read.add_tensors("w");
    grpc::ClientContext ctx;
    PullResponse r;
    REQUIRE(stub->Pull(&ctx, read, &r).ok());
    REQUIRE(r.slices_size() == 1);
    return r.slices(0).version();
  };

  // A newer epoch than the shard's (it has not learnt that map yet):
  // refused as unavailable (clients retry) on every path, naming both
  // epochs; nothing applied, and the unknown worker is not registered.
  // (Older epochs: slot_moves_test.)
  {
    grpc::ClientContext ctx;
    PushResponse r;
    const grpc::Status s = stub->Push(&ctx, push(1, 7), &r);
    CHECK(s.error_code() == grpc::StatusCode::UNAVAILABLE);
    CHECK(s.error_message().find("routed with 7") != std::string::npos);
    CHECK(s.error_message().find("epoch 1") != std::string::npos);
  }
  {
    grpc::ClientContext ctx;
    PullResponse r;
    const grpc::Status s = stub->Pull(&ctx, pull(7), &r);
    CHECK(s.error_code() == grpc::StatusCode::UNAVAILABLE);
  }
  CHECK(streams.Push(push(2, 7)).status().code() ==
        grpc::StatusCode::UNAVAILABLE);
  CHECK(streams.Pull(pull(7)).status().code() == grpc::StatusCode::UNAVAILABLE);
  CHECK(version() == 0);
  absl::StatusOr<std::vector<StatusResponse>> st = c->Status();
  REQUIRE_OK(st.status());
  CHECK((*st)[0].workers_size() == 0);

  // The shard's own epoch, and 0 (not routed by a map), are served.
  CHECK(streams.Push(push(3, ShardMap::kStaticEpoch)).status().code() == 0);
  CHECK(version() == 1);
  grpc::ClientContext ctx;
  PushResponse r;
  CHECK(stub->Push(&ctx, push(4, 0), &r).ok());
  CHECK(version() == 2);
}

}  // namespace
}  // namespace asyncps
