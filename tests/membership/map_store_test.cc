// MapStore (membership/map_store.h) against a real etcd process: one map
// per run prefix, changes by compare-and-swap one epoch at a time with no
// change lost under concurrent writers, and watchers that see every epoch.
#include "membership/map_store.h"

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/shard_maps.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

std::unique_ptr<EtcdClient> Connect(const testing::EtcdProcess& etcd) {
  EtcdClientOptions o;
  o.endpoints = {etcd.endpoint};
  absl::StatusOr<std::unique_ptr<EtcdClient>> c = EtcdClient::Connect(o);
  REQUIRE_OK(c.status());
  return *std::move(c);
}

TEST_CASE("one map per run prefix, starting at epoch 1", "[map]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  auto c = Connect(*etcd);
  MapStore maps(c.get(), "/asyncps/run-a");
  CHECK(absl::IsNotFound(maps.Get().status()));
  ShardMapRecord bad = testing::TwoByTwoMap("run-a");
  bad.mutable_groups(1)->mutable_replicas(0)->set_address("10.0.0.0:7000");
  CHECK(absl::IsInvalidArgument(maps.Initialize(bad).status()));
  CHECK(absl::IsNotFound(maps.Get().status()));  // nothing written

  absl::StatusOr<ShardMapRecord> map =
      maps.Initialize(testing::TwoByTwoMap("run-a"));
  REQUIRE_OK(map.status());
  CHECK(map->epoch() == 1);
  // The same run again: the map in force, unchanged.
  map = maps.Initialize(testing::TwoByTwoMap("run-a"));
  REQUIRE_OK(map.status());
  CHECK(map->epoch() == 1);
  // Another run on the same prefix: refused.
  const absl::Status other =
      maps.Initialize(testing::TwoByTwoMap("run-b")).status();
  CHECK(absl::IsFailedPrecondition(other));
  CHECK(other.message().find("run-a") != std::string::npos);
}

TEST_CASE("concurrent changes: every one lands, one epoch each", "[map]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  auto c = Connect(*etcd);
  MapStore maps(c.get(), "/asyncps/run-c");
  REQUIRE_OK(maps.Initialize(testing::TwoByTwoMap("run-c")).status());
  absl::StatusOr<MapStore::Read> start = maps.Get();
  REQUIRE_OK(start.status());

  // Watch every map written from now on.
  absl::Mutex mu;
  std::vector<uint64_t> epochs;
  auto watch = maps.Watch(
      start->mod_revision + 1,
      [&](const ShardMapRecord& m) {
        absl::MutexLock l(&mu);
        epochs.push_back(m.epoch());
      },
      nullptr);

  constexpr int kWriters = 4, kChanges = 8;
  std::vector<std::thread> writers;
  std::vector<absl::Status> results(kWriters);
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      auto own = Connect(*etcd);  // each writer its own client
      MapStore mine(own.get(), "/asyncps/run-c");
      for (int i = 0; i < kChanges; ++i) {
        absl::StatusOr<ShardMapRecord> r = mine.Update(
            [&](ShardMapRecord* m) -> absl::StatusOr<bool> {
              ReplicaRecord* spare = m->mutable_groups(w % 2)->add_replicas();
              spare->set_address(absl::StrCat("spare-", w, "-", i, ":7000"));
              return true;
            },
            /*max_attempts=*/100);
        if (!r.ok()) {
          results[w] = r.status();
          return;
        }
      }
    });
  }
  for (std::thread& t : writers) t.join();
  for (const absl::Status& s : results) REQUIRE_OK(s);

  absl::StatusOr<MapStore::Read> end = maps.Get();
  REQUIRE_OK(end.status());
  CHECK(end->map.epoch() == 1 + kWriters * kChanges);
  absl::flat_hash_set<std::string> spares;
  for (const ShardGroupRecord& g : end->map.groups()) {
    for (const ReplicaRecord& r : g.replicas()) {
      if (r.address().rfind("spare-", 0) == 0) spares.insert(r.address());
    }
  }
  CHECK(spares.size() == kWriters * kChanges);  // no change lost

  // A change that changes nothing writes nothing.
  absl::StatusOr<ShardMapRecord> same = maps.Update(
      [](ShardMapRecord*) -> absl::StatusOr<bool> { return false; });
  REQUIRE_OK(same.status());
  CHECK(same->epoch() == end->map.epoch());
  // A change may not alter the run's shape.
  CHECK(absl::IsInvalidArgument(
      maps.Update([](ShardMapRecord* m) -> absl::StatusOr<bool> {
            m->set_replicas(3);
            return true;
          })
          .status()));

  // The watcher saw epochs 2 .. 33, in order, none twice.
  REQUIRE_OK(testing::WaitFor(
      [&] {
        absl::MutexLock l(&mu);
        return epochs.size() >= kWriters * kChanges;
      },
      absl::Seconds(10), "the watched maps"));
  absl::MutexLock l(&mu);
  REQUIRE(epochs.size() == kWriters * kChanges);
  for (size_t i = 0; i < epochs.size(); ++i) CHECK(epochs[i] == i + 2);
}

}  // namespace
}  // namespace asyncps
