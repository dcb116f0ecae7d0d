// A replicated shard group fed random bytes and random protobuf wire data
// on every method of both replicas, the replication stream (ReplicaFeed
// Follow) included: neither replica crashes, hangs or answers as if it had
// a bug, the group keeps acknowledging pushes, and the replicas stay
// identical with every acknowledged push applied once.

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "client/ps_client.h"
#include "common/net.h"
#include "proto/replication.grpc.pb.h"
#include "tests/replication/replica_harness.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/raw_calls.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/shard_fuzz.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

using testing::ServerProcess;

constexpr int kElems = 64;

TensorSpec Tensor() {
  TensorSpec t;
  t.set_name("w");
  t.add_shape(kElems);
  t.set_init(INIT_CONSTANT);
  t.set_init_value(1.0f);
  t.mutable_optimizer()->set_type(OPT_SGD);
  t.mutable_optimizer()->set_learning_rate(1.0f);
  return t;
}

// Pulls w, then pushes a gradient of ones: w goes down by 1.
std::vector<float> Step(PsClient* c, int64_t step) {
  std::vector<float> w(kElems);
  auto pull = c->StartPull(step, step, PullSet{{{"w", w.data()}}, {}});
  REQUIRE_OK(pull->Wait());
  const std::vector<float> g(kElems, 1.0f);
  REQUIRE_OK(c->StartPush(step, PushSet{{{"w", g.data()}}, {}}, pull->read())
                 ->Wait()
                 .status());
  return w;
}

TEST_CASE(
    "random inputs on every method of a replicated group, its replication "
    "stream included, change nothing and stop nothing",
    "[replication][bad_input][fuzz]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  ServerProcess a, b;
  testing::StartReplicaPair(*etcd, "fuzz", &a, &b);
  std::unique_ptr<PsClient> c = testing::MapClient(*etcd, "fuzz");
  REQUIRE_OK(c->CreateTensors({Tensor()}));
  REQUIRE(Step(c.get(), 1) == std::vector<float>(kElems, 1.0f));

  testing::RandomWire input(4061);
  for (const ServerProcess* replica : {&a, &b}) {
    const std::vector<std::string> bugs =
        testing::FuzzShardMethods(replica->address, &input, 40, 20);
    INFO(absl::StrJoin(bugs, "\n"));
    CHECK(bugs.empty());
    REQUIRE(replica->process->Running());
  }
  // The group still acknowledges pushes through both replicas (the
  // primary waits for its backup), every one applied once.
  REQUIRE(Step(c.get(), 2) == std::vector<float>(kElems, 0.0f));
  REQUIRE(Step(c.get(), 3) == std::vector<float>(kElems, -1.0f));
  testing::ExpectSameState(a.address, b.address);
  absl::StatusOr<StatusResponse> sa = testing::ReplicaStatus(a.address);
  REQUIRE_OK(sa.status());
  CHECK(sa->replica().role() == "primary");

  // A Follow message of 32 MiB of empty unknown fields (field 15): costed
  // before it is parsed (gRPC's typed parse of 64 MiB of them took the
  // primary to 2.2 GB), refused, and the group goes on.
  const std::string flood = testing::EmptyUnknownFields(32 << 20);
  const pid_t pid = a.process->pid();
  const int64_t before = testing::ReadProcessResources(pid)->peak_rss_bytes;
  const grpc::Status s = testing::RawStreaming(
      MakeChannel(a.address), "/asyncps.Replication/Follow", {flood}, 60);
  INFO(s.error_message());
  CHECK(s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(s.error_message().find("parsing it would take more than") !=
        std::string::npos);
  const int64_t after = testing::ReadProcessResources(pid)->peak_rss_bytes;
  INFO("peak RSS " << before / 1e6 << " MB -> " << after / 1e6 << " MB");
  CHECK(after - before < (400 << 20));
  REQUIRE(Step(c.get(), 4) == std::vector<float>(kElems, -2.0f));
  testing::ExpectSameState(a.address, b.address);

  // Follow streams that never send their first message hold no feed
  // thread: with more of them open than the primary feeds at once, a
  // well-formed follow is still served (here: refused by the map, as a
  // stray replica is).
  auto stub = Replication::NewStub(MakeChannel(a.address));
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReaderWriter<FollowUp, FollowFeed>>>
      silent;
  for (int i = 0; i < 32; ++i) {  // ReplicaFeedService::kMaxFeeds is 16
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    silent.push_back(stub->Follow(contexts.back().get()));
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  auto stray = stub->Follow(&ctx);
  FollowUp follow;
  follow.mutable_follow()->set_run_id("fuzz");
  follow.mutable_follow()->set_num_shards(1);
  follow.mutable_follow()->set_address("127.0.0.1:1");
  follow.mutable_follow()->set_incarnation(5);
  REQUIRE(stray->Write(follow));
  stray->WritesDone();
  FollowFeed feed;
  CHECK_FALSE(stray->Read(&feed));
  const grpc::Status refused = stray->Finish();
  INFO(refused.error_message());
  CHECK(refused.error_code() == grpc::StatusCode::PERMISSION_DENIED);
  for (auto& c : contexts) c->TryCancel();
  for (auto& s : silent) s->Finish().IgnoreError();
  REQUIRE(Step(c.get(), 5) == std::vector<float>(kElems, -3.0f));
}

}  // namespace
}  // namespace asyncps
