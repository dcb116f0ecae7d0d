// LeaseKeeper (membership/lease_keeper.h) against a real etcd process: the
// lease is held while it is renewed (on one keep-alive stream), lost (once,
// never revived) when etcd cannot be reached for a TTL or revokes it, and
// revoked when the keeper goes.
#include "membership/lease_keeper.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <memory>

#include "absl/time/clock.h"
#include "common/clock.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

std::unique_ptr<EtcdClient> Connect(const testing::EtcdProcess& etcd) {
  EtcdClientOptions o;
  o.endpoints = {etcd.endpoint};
  o.call_timeout = absl::Milliseconds(500);
  absl::StatusOr<std::unique_ptr<EtcdClient>> c = EtcdClient::Connect(o);
  REQUIRE_OK(c.status());
  return *std::move(c);
}

// A keeper of a lease of `ttl` that counts its losses in `lost`.
absl::StatusOr<std::unique_ptr<LeaseKeeper>> StartLease(
    EtcdClient* etcd, absl::Duration ttl, std::atomic<int>* lost) {
  LeaseKeeperOptions o;
  o.etcd = etcd;
  o.ttl = ttl;
  o.on_lost = [lost] { ++*lost; };
  return LeaseKeeper::Start(o);
}

TEST_CASE("a renewed lease is held past its TTL and revoked at the end",
          "[lease]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  auto c = Connect(*etcd);
  CHECK(absl::IsInvalidArgument(LeaseKeeper::Start({}).status()));
  LeaseKeeperOptions o;
  o.etcd = c.get();
  o.ttl = absl::Milliseconds(500);
  CHECK(absl::IsInvalidArgument(LeaseKeeper::Start(o).status()));

  std::atomic<int> lost{0};
  o.ttl = absl::Seconds(2);
  o.on_lost = [&] { ++lost; };
  absl::StatusOr<int64_t> streams0 =
      testing::EtcdCallsStarted(*etcd, "LeaseKeepAlive");
  REQUIRE_OK(streams0.status());
  absl::StatusOr<std::unique_ptr<LeaseKeeper>> lease = LeaseKeeper::Start(o);
  REQUIRE_OK(lease.status());
  REQUIRE_OK(c->Put("/servers/a", "10.0.0.5:7000", (*lease)->id()).status());
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (absl::Now() < until) {
    REQUIRE((*lease)->Held());
    // Never promised beyond one TTL from now.
    REQUIRE((*lease)->HeldUntil() <= absl::Now() + absl::Seconds(2));
    absl::SleepFor(absl::Milliseconds(200));
  }
  CHECK(lost == 0);
  // About 7 renewals in 5 s, all on one keep-alive stream.
  absl::StatusOr<int64_t> streams =
      testing::EtcdCallsStarted(*etcd, "LeaseKeepAlive");
  REQUIRE_OK(streams.status());
  CHECK(*streams - *streams0 == 1);
  absl::StatusOr<std::optional<EtcdKeyValue>> kv = c->Get("/servers/a");
  REQUIRE_OK(kv.status());
  CHECK(kv->has_value());
  lease->reset();  // revokes
  kv = c->Get("/servers/a");
  REQUIRE_OK(kv.status());
  CHECK(!kv->has_value());
  CHECK(lost == 0);
}

TEST_CASE("etcd gone for a TTL: the lease is lost once and never revived",
          "[lease][faults]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  auto c = Connect(*etcd);
  std::atomic<int> lost{0};
  absl::StatusOr<std::unique_ptr<LeaseKeeper>> lease =
      StartLease(c.get(), absl::Seconds(2), &lost);
  REQUIRE_OK(lease.status());
  const absl::Time held_until = (*lease)->HeldUntil();
  REQUIRE_OK(etcd->process->Kill(absl::ZeroDuration()).status());
  const absl::Time killed = absl::Now();
  REQUIRE_OK(testing::WaitFor([&] { return !(*lease)->Held(); },
                              absl::Seconds(10), "the lease to be lost"));
  // Lost no later than a TTL after the last renewal it knew of.
  CHECK(absl::Now() - killed < absl::Seconds(4));
  CHECK(held_until <= killed + absl::Seconds(2));
  REQUIRE_OK(testing::WaitFor([&] { return lost.load() == 1; },
                              absl::Seconds(5), "on_lost"));
  // etcd back (it may even keep the lease alive): still lost.
  REQUIRE_OK(testing::RestartEtcd(&*etcd));
  absl::SleepFor(absl::Seconds(1));
  CHECK(!(*lease)->Held());
  CHECK((*lease)->HeldUntil() == absl::InfinitePast());
  CHECK(lost == 1);
}

// The real clock, but its first reading is `late` earlier: a grant that
// etcd answered that long after it was sent (a restarted etcd answers
// slowly).
class SlowGrantClock : public Clock {
 public:
  explicit SlowGrantClock(absl::Duration late) : late_(late) {}
  absl::Time Now() const override {
    return first_.exchange(false) ? absl::Now() - late_ : absl::Now();
  }

 private:
  const absl::Duration late_;
  mutable std::atomic<bool> first_{true};
};

TEST_CASE("a lease granted slowly is renewed before its short rest runs out",
          "[lease][faults]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  auto c = Connect(*etcd);
  SlowGrantClock clock(absl::Milliseconds(800));
  std::atomic<int> lost{0};
  LeaseKeeperOptions o;
  o.etcd = c.get();
  o.ttl = absl::Seconds(1);
  o.clock = &clock;
  o.on_lost = [&] { ++lost; };
  absl::StatusOr<std::unique_ptr<LeaseKeeper>> lease = LeaseKeeper::Start(o);
  REQUIRE_OK(lease.status());
  // Counted from the grant's send time, 0.2 s of it are left; renewals
  // every ttl / 3 came too late and lost it at once.
  CHECK((*lease)->HeldUntil() < absl::Now() + absl::Milliseconds(250));
  const absl::Time until = absl::Now() + absl::Seconds(3);
  while (absl::Now() < until && lost == 0) {
    CHECK((*lease)->Held());
    absl::SleepFor(absl::Milliseconds(50));
  }
  CHECK(lost == 0);
  CHECK((*lease)->Held());
}

TEST_CASE("a lease revoked elsewhere is lost at the next renewal", "[lease]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  auto c = Connect(*etcd);
  std::atomic<int> lost{0};
  absl::StatusOr<std::unique_ptr<LeaseKeeper>> lease =
      StartLease(c.get(), absl::Seconds(3), &lost);
  REQUIRE_OK(lease.status());
  auto other = Connect(*etcd);
  REQUIRE_OK(other->RevokeLease((*lease)->id()));
  REQUIRE_OK(testing::WaitFor([&] { return lost.load() == 1; },
                              absl::Seconds(5), "on_lost after a revoke"));
  CHECK(!(*lease)->Held());
}

}  // namespace
}  // namespace asyncps
