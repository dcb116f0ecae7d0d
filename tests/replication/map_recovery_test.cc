// MapRecovery (server/map_recovery.h) against a real etcd: replicas that
// find their run's map gone (or older than they saw) offer the newest map
// each saw; once the loss is `settle` old one writes the newest offered at
// the next epoch, exactly once, over whatever is at the key.
#include "server/map_recovery.h"

#include <catch2/catch.hpp>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "membership/lease_keeper.h"
#include "membership/map_store.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/shard_maps.h"

namespace asyncps {
namespace {

constexpr absl::Duration kSettle = absl::Milliseconds(300);

// One replica's view of the run: its etcd client, lease, map store and
// recovery, as a ReplicaGroup holds them.
struct Replica {
  std::shared_ptr<EtcdClient> etcd;
  std::unique_ptr<LeaseKeeper> lease;
  std::unique_ptr<MapStore> maps;
  std::unique_ptr<MapRecovery> recovery;
};

Replica MakeReplica(const testing::EtcdProcess& etcd, const std::string& id) {
  Replica r;
  absl::StatusOr<std::shared_ptr<EtcdClient>> c = testing::ConnectToEtcd(etcd);
  REQUIRE_OK(c.status());
  r.etcd = *c;
  LeaseKeeperOptions lo;
  lo.etcd = r.etcd.get();
  absl::StatusOr<std::unique_ptr<LeaseKeeper>> lease = LeaseKeeper::Start(lo);
  REQUIRE_OK(lease.status());
  r.lease = *std::move(lease);
  r.maps = std::make_unique<MapStore>(r.etcd.get(), RunPrefix("run"));
  r.recovery = std::make_unique<MapRecovery>(r.etcd.get(), r.maps.get(),
                                             RunPrefix("run"), id,
                                             spdlog::default_logger(), kSettle);
  return r;
}

// Run "run"'s 2 x 2 map at `epoch`, its shard 1 primary at `primary1`.
ShardMapRecord MapAt(uint64_t epoch, const std::string& primary1) {
  ShardMapRecord m = testing::TwoByTwoMap("run");
  m.set_epoch(epoch);
  m.mutable_groups(1)->mutable_replicas(0)->set_address(primary1);
  return m;
}

// One look of replica r: -1 when it finds the map in place, else the
// epoch it found (0: none, or no map).
int64_t Step(Replica& r) {
  absl::StatusOr<MapStore::Read> read = r.maps->Get();
  if (!r.recovery->Lost(read)) return -1;
  REQUIRE_OK(r.recovery->Step(read, r.lease->id()));
  return read.ok() ? static_cast<int64_t>(read->map.epoch()) : 0;
}

// The map key's revision (0: no key).
int64_t Revision(Replica& r) {
  absl::StatusOr<std::optional<EtcdKeyValue>> kv = r.etcd->Get(r.maps->key());
  REQUIRE_OK(kv.status());
  return kv->has_value() ? (*kv)->mod_revision : 0;
}

TEST_CASE(
    "a lost map is put back from the newest map a live replica saw, at the "
    "next epoch, once",
    "[map][recovery]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  Replica a = MakeReplica(*etcd, "a");
  Replica b = MakeReplica(*etcd, "b");
  // a saw epoch 7 (shard 1's primary 10.0.0.9), b only epoch 5.
  a.maps->Saw(MapAt(7, "10.0.0.9:7000"));
  a.maps->Saw(MapAt(6, "10.0.0.6:7000"));  // older: not the newest
  b.maps->Saw(MapAt(5, "10.0.0.5:7000"));
  REQUIRE(a.maps->newest().epoch() == 7);

  SECTION("no map at the key") {}
  SECTION("a newer run's first map at the key (a server started meanwhile)") {
    REQUIRE_OK(a.maps->Initialize(testing::TwoByTwoMap("run")).status());
    // Seen by a's store now, but older than what a saw before.
    REQUIRE(a.maps->newest().epoch() == 7);
  }
  SECTION("a value at the key that is no map") {
    REQUIRE_OK(
        a.etcd->Put(a.maps->key(), "\xff\xff\xff\xff not a map").status());
    REQUIRE(absl::IsDataLoss(a.maps->Get().status()));
  }
  // Both find it lost and offer; nothing is written before the settle time.
  const int64_t lost_at = Revision(a);
  CHECK(Step(b) >= 0);
  CHECK(Step(a) >= 0);
  CHECK(Revision(a) == lost_at);
  absl::SleepFor(kSettle + absl::Milliseconds(50));
  absl::StatusOr<MapStore::Read> now;
  // b, which saw less, writes a's newer map, at epoch 8.
  CHECK(Step(b) >= 0);
  now = b.maps->Get();
  REQUIRE_OK(now.status());
  CHECK(now->map.epoch() == 8);
  CHECK(now->map.groups(1).replicas(0).address() == "10.0.0.9:7000");
  const int64_t revision = now->mod_revision;
  // Nobody finds it lost now, and nobody writes it again.
  CHECK(Step(a) == -1);
  CHECK(Step(b) == -1);
  // A recovery that looked before b wrote finds the map put back and
  // writes nothing.
  REQUIRE_OK(
      a.recovery->Step(absl::NotFoundError("looked before"), a.lease->id()));
  now = a.maps->Get();
  REQUIRE_OK(now.status());
  CHECK(now->mod_revision == revision);
  CHECK(now->map.epoch() == 8);
  // The offers go once the map is found.
  absl::StatusOr<EtcdClient::Listing> offers =
      a.etcd->List(absl::StrCat(RunPrefix("run"), "/recovery/"));
  REQUIRE_OK(offers.status());
  CHECK(offers->kvs.size() == 2);
  a.recovery->Found();
  b.recovery->Found();
  offers = a.etcd->List(absl::StrCat(RunPrefix("run"), "/recovery/"));
  REQUIRE_OK(offers.status());
  CHECK(offers->kvs.empty());
}

TEST_CASE("a map that was never seen is not made up", "[map][recovery]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  Replica a = MakeReplica(*etcd, "a");
  REQUIRE(Step(a) == 0);
  absl::SleepFor(kSettle + absl::Milliseconds(50));
  REQUIRE(Step(a) == 0);
  CHECK(absl::IsNotFound(a.maps->Get().status()));
}

}  // namespace
}  // namespace asyncps
