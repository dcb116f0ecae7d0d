// PsClient with a ShardRouter (PsClientOptions::router) on real ps_server
// processes: when the router moves a shard to another process, the same
// client's next attempts (also the retries of a call in flight) go there,
// and the move is logged; while the router names no address, calls retry
// until one appears or their deadline passes. With a MapRouter, a map
// change written to etcd moves the client likewise.

#include <catch2/catch.hpp>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/ps_client.h"
#include "common/shard_router.h"
#include "membership/map_router.h"
#include "membership/map_store.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/shard_maps.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/tensor_specs.h"

namespace asyncps {
namespace {

using testing::ServerProcess;
using testing::StartPsServer;

// A router the test moves by hand.
class TestRouter : public ShardRouter {
 public:
  explicit TestRouter(std::vector<std::string> addresses)
      : addresses_(std::move(addresses)) {}

  int num_shards() const override {
    absl::MutexLock l(&mu_);
    return static_cast<int>(addresses_.size());
  }
  std::string Address(int shard) const override {
    absl::MutexLock l(&mu_);
    return addresses_[shard];
  }
  uint64_t generation() const override { return generation_.load(); }

  void Move(int shard, std::string address) {
    absl::MutexLock l(&mu_);
    addresses_[shard] = std::move(address);
    ++generation_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> addresses_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> generation_{1};
};

// A logger whose lines the test reads.
struct CapturedLog {
  std::ostringstream lines;
  std::shared_ptr<spdlog::logger> logger = std::make_shared<spdlog::logger>(
      "client", std::make_shared<spdlog::sinks::ostream_sink_mt>(lines));
  std::string Text() {
    logger->flush();
    return lines.str();
  }
};

std::unique_ptr<PsClient> Connect(std::shared_ptr<ShardRouter> router,
                                  std::shared_ptr<spdlog::logger> logger,
                                  absl::Duration deadline) {
  PsClientOptions o;
  o.router = std::move(router);
  o.logger = std::move(logger);
  o.retry.call_deadline = deadline;
  absl::StatusOr<std::unique_ptr<PsClient>> c = PsClient::Connect(o);
  REQUIRE_OK(c.status());
  return *std::move(c);
}

TensorSpec Weights() {
  return testing::ConstantSpec("w", {12}, 1.0f, testing::SgdSpec(1.0f), 4);
}

ServerProcess StartShard() {
  absl::StatusOr<ServerProcess> shard = StartPsServer(0, 1);
  REQUIRE_OK(shard.status());
  return *std::move(shard);
}

TEST_CASE("a client follows its router to a shard's new process", "[router]") {
  ServerProcess a = StartShard();
  auto router =
      std::make_shared<TestRouter>(std::vector<std::string>{a.address});
  CapturedLog log;
  auto client = Connect(router, log.logger, absl::Seconds(30));
  CHECK(client->num_shards() == 1);
  CHECK(client->ShardName(0) == "shard 0 (" + a.address + ")");
  REQUIRE_OK(client->WaitForShards(absl::Seconds(30)));
  REQUIRE_OK(client->CreateTensors({Weights()}));
  REQUIRE_OK(client->Register().status());
  std::vector<float> w(12);
  REQUIRE_OK(client->Pull(0, {{"w", w.data()}}));
  const std::vector<float> grad(12, 0.25f);
  REQUIRE_OK(client->Push(0, {{"w", grad.data()}}).status());
  REQUIRE_OK(client->Pull(1, {{"w", w.data()}}));
  CHECK(w[0] == 0.75f);

  // Shard 0 moves: a fresh process B holds it (its tensor created there),
  // A stops.
  ServerProcess b = StartShard();
  {
    PsClientOptions o;
    o.servers = {b.address};
    auto creator = PsClient::Connect(o);
    REQUIRE_OK(creator.status());
    REQUIRE_OK((*creator)->WaitForShards(absl::Seconds(30)));
    REQUIRE_OK((*creator)->CreateTensors({Weights()}));
  }
  REQUIRE_OK(a.process->Kill().status());

  // A pull started while the router still names A retries there, then
  // follows the router to B.
  auto pull = client->StartPull(1, 1, {{"w", w.data()}});
  absl::SleepFor(absl::Milliseconds(300));
  router->Move(0, b.address);
  REQUIRE_OK(pull->Wait());
  CHECK(w[0] == 1.0f);  // B's fresh values
  CHECK(client->ShardName(0) == "shard 0 (" + b.address + ")");

  // The same client pushes to B and reads its update back.
  REQUIRE_OK(client->Register().status());
  REQUIRE_OK(client->Pull(1, {{"w", w.data()}}));
  REQUIRE_OK(client->Push(1, {{"w", grad.data()}}).status());
  REQUIRE_OK(client->Pull(2, {{"w", w.data()}}));
  CHECK(w[0] == 0.75f);

  const std::string text = log.Text();
  INFO(text);
  CHECK(absl::StrContains(
      text, "shard 0 moved from " + a.address + " to " + b.address));
}

TEST_CASE("while the router names no address, calls retry until one appears",
          "[router]") {
  ServerProcess a = StartShard();
  auto router = std::make_shared<TestRouter>(std::vector<std::string>{""});
  CapturedLog log;
  auto client = Connect(router, log.logger, absl::Seconds(2));
  CHECK(client->ShardName(0) == "shard 0 (no primary known)");

  // No address within the call's deadline: it ends, saying why.
  const absl::Time start = absl::Now();
  const absl::Status none = client->CreateTensors({Weights()});
  CHECK(absl::IsDeadlineExceeded(none));
  CHECK(absl::StrContains(none.message(), "no primary"));
  CHECK(absl::Now() - start >= absl::Seconds(2));
  CHECK(absl::Now() - start < absl::Seconds(10));

  // An address appearing while the call retries: it succeeds there.
  auto patient = Connect(router, log.logger, absl::Seconds(30));
  std::thread mover([&] {
    absl::SleepFor(absl::Seconds(1));
    router->Move(0, a.address);
  });
  const absl::Time begin = absl::Now();
  const absl::Status created = patient->CreateTensors({Weights()});
  mover.join();
  REQUIRE_OK(created);
  CHECK(absl::Now() - begin >= absl::Milliseconds(900));
  CHECK(patient->ShardName(0) == "shard 0 (" + a.address + ")");
  CHECK(absl::StrContains(log.Text(),
                          "shard 0 moved from (none) to " + a.address));
}

TEST_CASE("servers given with a router must match its shard count",
          "[router]") {
  PsClientOptions o;
  o.router = std::make_shared<TestRouter>(
      std::vector<std::string>{"127.0.0.1:1", "127.0.0.1:2"});
  o.servers = {"127.0.0.1:1"};
  const absl::Status s = PsClient::Connect(o).status();
  CHECK(absl::IsInvalidArgument(s));
  CHECK(absl::StrContains(s.message(), "2 shards"));
  o.servers = {"127.0.0.1:1", "127.0.0.1:2"};
  REQUIRE_OK(PsClient::Connect(o).status());
}

TEST_CASE("a client with a MapRouter follows a failover written to etcd",
          "[router][etcd]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  absl::StatusOr<std::shared_ptr<EtcdClient>> c = testing::ConnectToEtcd(*etcd);
  REQUIRE_OK(c.status());
  ServerProcess a = StartShard();
  ServerProcess b = StartShard();
  // Shard 0's group: A the primary, B its backup (here a fresh shard of its
  // own, the tensor created on both).
  MapStore maps(c->get(), RunPrefix("follow"));
  REQUIRE_OK(
      maps.Initialize(testing::OneShardMap("follow", {a.address, b.address}))
          .status());

  CapturedLog log;
  MapRouterOptions o;
  o.logger = log.logger;
  absl::StatusOr<std::shared_ptr<MapRouter>> router =
      MapRouter::Connect({etcd->endpoint}, "follow", o);
  REQUIRE_OK(router.status());
  auto client = Connect(*router, log.logger, absl::Seconds(30));
  REQUIRE_OK(client->CreateTensors({Weights()}));
  {
    PsClientOptions direct;
    direct.servers = {b.address};
    auto creator = PsClient::Connect(direct);
    REQUIRE_OK(creator.status());
    REQUIRE_OK((*creator)->CreateTensors({Weights()}));
  }
  REQUIRE_OK(client->Register().status());
  std::vector<float> w(12);
  const std::vector<float> grad(12, 0.5f);
  REQUIRE_OK(client->Pull(0, {{"w", w.data()}}));
  REQUIRE_OK(client->Push(0, {{"w", grad.data()}}).status());

  // A dies; B is promoted in the map.
  REQUIRE_OK(a.process->Kill().status());
  REQUIRE_OK(maps.Update([](ShardMapRecord* m) -> absl::StatusOr<bool> {
                   m->mutable_groups(0)->mutable_replicas()->SwapElements(0, 1);
                   return true;
                 })
                 .status());
  REQUIRE_OK(client->Register().status());
  REQUIRE_OK(client->Pull(1, {{"w", w.data()}}));
  CHECK(w[0] == 1.0f);  // B's own values
  CHECK(client->ShardName(0) == "shard 0 (" + b.address + ")");
  const std::string text = log.Text();
  INFO(text);
  CHECK(absl::StrContains(text, "shard map epoch 2: shard 0 primary " +
                                    a.address + " -> " + b.address));
  CHECK(absl::StrContains(
      text, "shard 0 moved from " + a.address + " to " + b.address));
}

}  // namespace
}  // namespace asyncps
