// MapRouter (membership/map_router.h) against a real etcd process: it waits
// for the run's map, follows each shard's primary through map changes
// (the generation moving with every address change), keeps following
// across an etcd restart, and says what to fix when etcd or the map is not
// there.
#include "membership/map_router.h"

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "membership/map_store.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/shard_maps.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

std::shared_ptr<EtcdClient> Connect(const testing::EtcdProcess& etcd) {
  absl::StatusOr<std::shared_ptr<EtcdClient>> c = testing::ConnectToEtcd(etcd);
  REQUIRE_OK(c.status());
  return *c;
}

// Shard `shard`'s backup becomes its primary.
MapStore::Change Promote(int shard) {
  return [shard](ShardMapRecord* m) -> absl::StatusOr<bool> {
    auto* replicas = m->mutable_groups(shard)->mutable_replicas();
    replicas->SwapElements(0, 1);
    return true;
  };
}

// Waits until the router names `address` for `shard`.
void AwaitAddress(const MapRouter& router, int shard,
                  const std::string& address) {
  REQUIRE_OK(testing::WaitFor(
      [&] { return router.Address(shard) == address; }, absl::Seconds(30),
      absl::StrCat("shard ", shard, " at ", address), absl::Milliseconds(20)));
}

TEST_CASE("a MapRouter follows each shard's primary through map changes",
          "[map_router]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  std::shared_ptr<EtcdClient> c = Connect(*etcd);
  MapStore maps(c.get(), RunPrefix("run-r"));
  CHECK(maps.key() == "/asyncps/run-r/map");

  // The router starts before the shards wrote the map, and waits for it.
  absl::StatusOr<std::shared_ptr<MapRouter>> started =
      absl::UnknownError("not started");
  std::thread starter([&] {
    MapRouterOptions o;
    o.wait_for_map = absl::Seconds(20);
    started = MapRouter::Start(c, RunPrefix("run-r"), o);
  });
  absl::SleepFor(absl::Milliseconds(500));
  REQUIRE_OK(maps.Initialize(testing::TwoByTwoMap("run-r")).status());
  starter.join();
  REQUIRE_OK(started.status());
  MapRouter& router = **started;
  CHECK(router.num_shards() == 2);
  CHECK(router.Address(0) == "10.0.0.0:7000");
  CHECK(router.Address(1) == "10.0.0.2:7000");
  CHECK(router.map().epoch() == 1);
  const uint64_t g1 = router.generation();

  // Update 1: shard 0 fails over to its backup.
  REQUIRE_OK(maps.Update(Promote(0)).status());
  AwaitAddress(router, 0, "10.0.0.1:7000");
  CHECK(router.Address(1) == "10.0.0.2:7000");
  const uint64_t g2 = router.generation();
  CHECK(g2 > g1);

  // Update 2: shard 1 loses every replica: no address, until one returns.
  REQUIRE_OK(maps.Update([](ShardMapRecord* m) -> absl::StatusOr<bool> {
                   m->mutable_groups(1)->clear_replicas();
                   return true;
                 })
                 .status());
  AwaitAddress(router, 1, "");
  CHECK(router.generation() > g2);
  CHECK(router.map().epoch() == 3);

  // A change that moves no primary (a backup catching up) leaves the
  // generation alone.
  const uint64_t g3 = router.generation();
  REQUIRE_OK(maps.Update([](ShardMapRecord* m) -> absl::StatusOr<bool> {
                   m->mutable_groups(0)->mutable_replicas(1)->set_caught_up(
                       false);
                   return true;
                 })
                 .status());
  REQUIRE_OK(testing::WaitFor([&] { return router.map().epoch() == 4; },
                              absl::Seconds(30), "epoch 4"));
  CHECK(router.generation() == g3);
}

TEST_CASE("a MapRouter keeps following across an etcd restart",
          "[map_router]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  std::shared_ptr<EtcdClient> c = Connect(*etcd);
  MapStore maps(c.get(), RunPrefix("run-s"));
  REQUIRE_OK(maps.Initialize(testing::TwoByTwoMap("run-s")).status());
  MapRouterOptions o;
  o.max_backoff = absl::Milliseconds(500);
  absl::StatusOr<std::shared_ptr<MapRouter>> router =
      MapRouter::Start(c, RunPrefix("run-s"), o);
  REQUIRE_OK(router.status());

  REQUIRE_OK(testing::RestartEtcd(&*etcd));
  REQUIRE_OK(maps.Update(Promote(1)).status());
  AwaitAddress(**router, 1, "10.0.0.3:7000");

  // And again: a second restart, a second failover.
  REQUIRE_OK(testing::RestartEtcd(&*etcd));
  REQUIRE_OK(maps.Update(Promote(0)).status());
  AwaitAddress(**router, 0, "10.0.0.1:7000");
  CHECK((*router)->map().epoch() == 3);
}

TEST_CASE("no map at the run's prefix: NOT_FOUND naming the key",
          "[map_router]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  MapRouterOptions o;
  o.wait_for_map = absl::Milliseconds(500);
  const absl::Status s =
      MapRouter::Connect({etcd->endpoint}, "nobody", o).status();
  CHECK(absl::IsNotFound(s));
  CHECK(s.message().find("/asyncps/nobody/map") != std::string::npos);
  CHECK(s.message().find(etcd->endpoint) != std::string::npos);
}

TEST_CASE("etcd unreachable: UNAVAILABLE naming the endpoints, quickly",
          "[map_router]") {
  absl::StatusOr<std::string> nowhere = testing::UnusedLoopbackAddress();
  REQUIRE_OK(nowhere.status());
  MapRouterOptions o;
  o.etcd_call_timeout = absl::Seconds(1);
  const absl::Time start = absl::Now();
  const absl::Status s = MapRouter::Connect({*nowhere}, "run", o).status();
  CHECK(absl::IsUnavailable(s));
  CHECK(s.message().find(*nowhere) != std::string::npos);
  CHECK(s.message().find("etcd runs there") != std::string::npos);
  CHECK(absl::Now() - start < absl::Seconds(5));
}

}  // namespace
}  // namespace asyncps
