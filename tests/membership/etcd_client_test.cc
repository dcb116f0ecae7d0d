// The etcd v3 client (membership/etcd_client.h) against a real etcd
// process on loopback: keys, prefixes and revisions, compare-and-swap,
// leases that expire or are kept, watches, and etcd killed and restarted.
#include "membership/etcd_client.h"

#include <catch2/catch.hpp>
#include <csignal>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

std::unique_ptr<EtcdClient> Connect(
    const testing::EtcdProcess& etcd, absl::Duration timeout = absl::Seconds(5),
    absl::Duration watch_check_every = absl::Seconds(1)) {
  EtcdClientOptions o;
  o.endpoints = {etcd.endpoint};
  o.call_timeout = timeout;
  o.watch_check_every = watch_check_every;
  absl::StatusOr<std::unique_ptr<EtcdClient>> c = EtcdClient::Connect(o);
  REQUIRE_OK(c.status());
  return *std::move(c);
}

TEST_CASE("bad options are refused", "[etcd]") {
  CHECK(absl::IsInvalidArgument(EtcdClient::Connect({}).status()));
  EtcdClientOptions o;
  o.endpoints = {"no-port"};
  CHECK(absl::IsInvalidArgument(EtcdClient::Connect(o).status()));
  o.endpoints = {"127.0.0.1:1"};
  o.call_timeout = absl::ZeroDuration();
  CHECK(absl::IsInvalidArgument(EtcdClient::Connect(o).status()));
  o.call_timeout = absl::Seconds(1);
  o.watch_check_every = absl::Milliseconds(-1);
  CHECK(absl::IsInvalidArgument(EtcdClient::Connect(o).status()));
  CHECK(EtcdClient::PrefixEnd("/a/") == "/a0");
  CHECK(EtcdClient::PrefixEnd(std::string("a\xff", 2)) == "b");
}

TEST_CASE("keys, prefixes and revisions", "[etcd]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  auto c = Connect(*etcd);
  absl::StatusOr<int64_t> r1 = c->Put("/run/a", "1");
  REQUIRE_OK(r1.status());
  absl::StatusOr<int64_t> r2 = c->Put("/run/b", "2");
  REQUIRE_OK(r2.status());
  CHECK(*r2 == *r1 + 1);
  REQUIRE_OK(c->Put("/other", "x").status());
  absl::StatusOr<std::optional<EtcdKeyValue>> a = c->Get("/run/a");
  REQUIRE_OK(a.status());
  REQUIRE(a->has_value());
  CHECK((*a)->value == "1");
  CHECK((*a)->mod_revision == *r1);
  CHECK((*a)->version == 1);
  absl::StatusOr<EtcdClient::Listing> list = c->List("/run/");
  REQUIRE_OK(list.status());
  REQUIRE(list->kvs.size() == 2);
  CHECK(list->kvs[0].key == "/run/a");
  CHECK(list->kvs[1].key == "/run/b");
  CHECK(list->revision == *r2 + 1);
  absl::StatusOr<int64_t> deleted = c->Delete("/run/a");
  REQUIRE_OK(deleted.status());
  CHECK(*deleted == 1);
  a = c->Get("/run/a");
  REQUIRE_OK(a.status());
  CHECK(!a->has_value());
}

TEST_CASE(
    "a test's etcd takes its data directory and its log with it when it goes",
    "[etcd]") {
  if (testing::SkipWithoutEtcd()) return;
  std::string dir, log;
  {
    absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
    REQUIRE_OK(etcd.status());
    dir = etcd->data_dir;
    log = etcd->log;
    REQUIRE_OK(Connect(*etcd)->Put("/k", "v").status());
    testing::EtcdProcess moved = *std::move(etcd);  // the owner moves along
    CHECK(std::filesystem::exists(dir + "/member"));
    CHECK(std::filesystem::exists(log));
    // Restarted without its data: a new folder, the old one gone.
    REQUIRE_OK(testing::RestartEtcd(&moved, absl::Seconds(30),
                                    absl::ZeroDuration(), /*wipe=*/true));
    CHECK_FALSE(std::filesystem::exists(dir));
    CHECK(moved.data_dir != dir);
    dir = moved.data_dir;
    log = moved.log;
    CHECK(std::filesystem::exists(dir + "/member"));
  }
  CHECK_FALSE(std::filesystem::exists(dir));
  CHECK_FALSE(std::filesystem::exists(log));
}

TEST_CASE("compare-and-swap on a key's revision", "[etcd]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  auto c = Connect(*etcd);
  // Only one of two creators wins the absent key.
  absl::StatusOr<EtcdClient::Swap> first =
      c->CompareAndSwap("/primary/0", 0, "shard-a");
  REQUIRE_OK(first.status());
  CHECK(first->swapped);
  absl::StatusOr<EtcdClient::Swap> second =
      c->CompareAndSwap("/primary/0", 0, "shard-b");
  REQUIRE_OK(second.status());
  CHECK(!second->swapped);
  REQUIRE(second->current.has_value());
  CHECK(second->current->value == "shard-a");
  const int64_t seen = second->current->mod_revision;
  // A swap from the revision read succeeds once; a stale one fails.
  absl::StatusOr<EtcdClient::Swap> next =
      c->CompareAndSwap("/primary/0", seen, "shard-b");
  REQUIRE_OK(next.status());
  CHECK(next->swapped);
  absl::StatusOr<EtcdClient::Swap> stale =
      c->CompareAndSwap("/primary/0", seen, "shard-c");
  REQUIRE_OK(stale.status());
  CHECK(!stale->swapped);
  CHECK(stale->current->value == "shard-b");
  CHECK(absl::IsInvalidArgument(
      c->CompareAndSwap("/primary/0", -1, "x").status()));
}

TEST_CASE("a key on a lease lives while the lease is renewed", "[etcd]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  auto c = Connect(*etcd);
  CHECK(absl::IsInvalidArgument(c->GrantLease(absl::ZeroDuration()).status()));
  absl::StatusOr<int64_t> kept = c->GrantLease(absl::Seconds(2));
  REQUIRE_OK(kept.status());
  absl::StatusOr<int64_t> dropped = c->GrantLease(absl::Seconds(2));
  REQUIRE_OK(dropped.status());
  REQUIRE_OK(c->Put("/live/kept", "1", *kept).status());
  REQUIRE_OK(c->Put("/live/dropped", "1", *dropped).status());
  absl::StatusOr<int64_t> streams0 =
      testing::EtcdCallsStarted(*etcd, "LeaseKeepAlive");
  REQUIRE_OK(streams0.status());
  // Renew one lease for twice its TTL, on one stream; the other lapses.
  std::unique_ptr<EtcdClient::LeaseStream> stream = c->OpenLeaseStream();
  const absl::Time until = absl::Now() + absl::Seconds(4);
  int renewals = 0;
  while (absl::Now() < until) {
    absl::StatusOr<absl::Duration> left = stream->Renew(*kept);
    REQUIRE_OK(left.status());
    CHECK(*left > absl::ZeroDuration());
    ++renewals;
    absl::SleepFor(absl::Milliseconds(500));
  }
  CHECK(renewals >= 6);
  REQUIRE_OK(testing::WaitFor(
      [&] {
        auto kv = c->Get("/live/dropped");
        return kv.ok() && !kv->has_value();
      },
      absl::Seconds(10), "the lapsed lease's key to go"));
  absl::StatusOr<std::optional<EtcdKeyValue>> still = c->Get("/live/kept");
  REQUIRE_OK(still.status());
  CHECK(still->has_value());
  // A lease that is gone is NOT_FOUND, and the stream goes on.
  CHECK(absl::IsNotFound(stream->Renew(*dropped).status()));
  REQUIRE_OK(stream->Renew(*kept).status());
  absl::StatusOr<int64_t> streams =
      testing::EtcdCallsStarted(*etcd, "LeaseKeepAlive");
  REQUIRE_OK(streams.status());
  CHECK(*streams - *streams0 == 1);
  // Revoking ends the lease and its keys at once.
  REQUIRE_OK(c->RevokeLease(*kept));
  still = c->Get("/live/kept");
  REQUIRE_OK(still.status());
  CHECK(!still->has_value());
}

TEST_CASE("a lease stream can be destroyed as soon as a renewal returns",
          "[etcd]") {
  // The destructor waits for gRPC's last reaction (OnDone), which ran on
  // a gRPC thread: a reaction that touched the stream after letting the
  // destructor go on wrote to freed memory (once, a process ended on a
  // std::system_error from a freed condition variable's mutex). Under
  // --config=asan a use after free is reported; without it the loop at
  // least shows that nothing hangs or crashes.
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  auto c = Connect(*etcd);
  absl::StatusOr<int64_t> lease = c->GrantLease(absl::Seconds(5));
  REQUIRE_OK(lease.status());
  int renewed = 0;
  for (int i = 0; i < 300; ++i) {
    std::unique_ptr<EtcdClient::LeaseStream> stream = c->OpenLeaseStream();
    absl::StatusOr<absl::Duration> left = stream->Renew(*lease);
    if (left.ok() && *left > absl::ZeroDuration()) ++renewed;
  }
  CHECK(renewed == 300);
}

TEST_CASE("a lease grant waits for etcd at most its TTL", "[etcd]") {
  // A grant answered after its TTL would be of no use, and one that hangs
  // (a member forwarding it to a leader that died) would hold its caller
  // for the whole call timeout.
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  auto c = Connect(*etcd, /*timeout=*/absl::Seconds(8));
  REQUIRE_OK(c->GrantLease(absl::Seconds(1)).status());
  REQUIRE_OK(etcd->process->Signal(SIGSTOP));
  const absl::Time t0 = absl::Now();
  absl::StatusOr<int64_t> grant = c->GrantLease(absl::Seconds(1));
  const absl::Duration took = absl::Now() - t0;
  REQUIRE_OK(etcd->process->Signal(SIGCONT));
  CHECK(absl::IsDeadlineExceeded(grant.status()));
  // 1 s and scheduling, far below the call timeout's 8 s.
  CHECK(took < absl::Seconds(5));
  REQUIRE_OK(c->GrantLease(absl::Seconds(1)).status());
}

// What a watch delivered.
struct Seen {
  absl::Mutex mu;
  std::vector<EtcdEvent> events ABSL_GUARDED_BY(mu);
  absl::Status end ABSL_GUARDED_BY(mu);
  bool ended ABSL_GUARDED_BY(mu) = false;
};

std::unique_ptr<EtcdClient::Watcher> Watch(EtcdClient* c, const char* prefix,
                                           int64_t from, Seen* seen) {
  return c->WatchPrefix(
      prefix, from,
      [seen](const std::vector<EtcdEvent>& events, int64_t) {
        absl::MutexLock l(&seen->mu);
        for (const EtcdEvent& e : events) seen->events.push_back(e);
      },
      [seen](const absl::Status& s) {
        absl::MutexLock l(&seen->mu);
        seen->end = s;
        seen->ended = true;
      });
}

TEST_CASE("a watch sees every change under its prefix, in order", "[etcd]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  auto c = Connect(*etcd);
  absl::StatusOr<int64_t> before = c->Put("/map/epoch", "1");
  REQUIRE_OK(before.status());
  Seen live, replay;
  auto w = Watch(c.get(), "/map/", 0, &live);
  // From a past revision: the first put too.
  auto r = Watch(c.get(), "/map/", *before, &replay);
  absl::SleepFor(absl::Milliseconds(200));  // let the live watch start
  REQUIRE_OK(c->Put("/map/epoch", "2").status());
  REQUIRE_OK(c->Put("/elsewhere", "x").status());
  REQUIRE_OK(c->Delete("/map/epoch").status());
  REQUIRE_OK(testing::WaitFor(
      [&] {
        absl::MutexLock l(&live.mu);
        absl::MutexLock m(&replay.mu);
        return live.events.size() >= 2 && replay.events.size() >= 3;
      },
      absl::Seconds(10), "the watch events"));
  absl::MutexLock l(&live.mu);
  REQUIRE(live.events.size() == 2);
  CHECK(!live.events[0].deleted);
  CHECK(live.events[0].kv.value == "2");
  CHECK(live.events[1].deleted);
  CHECK(live.events[1].kv.key == "/map/epoch");
  absl::MutexLock m(&replay.mu);
  REQUIRE(replay.events.size() == 3);
  CHECK(replay.events[0].kv.value == "1");
  CHECK(replay.events[0].kv.mod_revision == *before);
  CHECK(!live.ended);
}

bool Ended(Seen* seen) {
  absl::MutexLock l(&seen->mu);
  return seen->ended;
}

TEST_CASE(
    "a watch that etcd stops answering ends within its check and the call "
    "timeout; one that etcd answers stays, however idle",
    "[etcd][faults]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  auto checked = Connect(*etcd, absl::Seconds(1), absl::Milliseconds(200));
  auto unchecked = Connect(*etcd, absl::Seconds(1), absl::ZeroDuration());
  Seen a, b;
  auto wa = Watch(checked.get(), "/idle/", 0, &a);
  auto wb = Watch(unchecked.get(), "/idle/", 0, &b);
  // Idle for 10 checks: every progress request is answered.
  absl::SleepFor(absl::Seconds(2));
  CHECK(!Ended(&a));
  REQUIRE_OK(checked->Put("/idle/k", "1").status());
  REQUIRE_OK(testing::WaitFor(
      [&] {
        absl::MutexLock l(&a.mu);
        return a.events.size() == 1;
      },
      absl::Seconds(10), "the event after the checks"));

  // etcd stops answering (its connections stay open, as with a peer that
  // died without a word): the checked watch ends within its check (0.2 s)
  // and the call timeout (1 s), saying why.
  REQUIRE_OK(etcd->process->Signal(SIGSTOP));
  REQUIRE_OK(
      testing::WaitFor([&] { return Ended(&a); }, absl::Seconds(10),
                       "the checked watch to end while etcd is stopped"));
  {
    absl::MutexLock l(&a.mu);
    CHECK(absl::IsUnavailable(a.end));
    CHECK_THAT(std::string(a.end.message()),
               Catch::Contains("a progress request unanswered for 1s"));
  }
  // A watch with no checks stays open on the silent stream: whatever
  // changes meanwhile, its caller never learns the watch is stale.
  absl::SleepFor(absl::Seconds(1));
  CHECK(!Ended(&b));
  REQUIRE_OK(etcd->process->Signal(SIGCONT));
}

TEST_CASE(
    "etcd killed: calls and renewals fail within their deadline; "
    "restarted: the data and the lease are back",
    "[etcd][faults]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  auto c = Connect(*etcd, absl::Seconds(2));
  REQUIRE_OK(c->Put("/durable", "yes").status());
  absl::StatusOr<int64_t> lease = c->GrantLease(absl::Seconds(30));
  REQUIRE_OK(lease.status());
  std::unique_ptr<EtcdClient::LeaseStream> stream = c->OpenLeaseStream();
  REQUIRE_OK(stream->Renew(*lease).status());
  Seen seen;
  auto w = Watch(c.get(), "/durable", 0, &seen);
  absl::SleepFor(absl::Milliseconds(200));
  REQUIRE_OK(etcd->process->Kill(absl::ZeroDuration()).status());
  absl::Time start = absl::Now();
  const absl::Status s = c->Put("/durable", "no").status();
  CHECK((absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)));
  CHECK(absl::Now() - start < absl::Seconds(10));
  // A renewal fails within the call timeout and ends its stream: the next
  // one on it fails at once.
  start = absl::Now();
  const absl::Status renewal = stream->Renew(*lease).status();
  CHECK((absl::IsUnavailable(renewal) || absl::IsDeadlineExceeded(renewal)));
  CHECK(absl::Now() - start < absl::Seconds(4));
  start = absl::Now();
  CHECK(stream->Renew(*lease).status() == renewal);
  CHECK(absl::Now() - start < absl::Milliseconds(500));
  REQUIRE_OK(testing::WaitFor(
      [&] {
        absl::MutexLock l(&seen.mu);
        return seen.ended;
      },
      absl::Seconds(10), "the watch to end"));
  {
    absl::MutexLock l(&seen.mu);
    CHECK(!seen.end.ok());
  }
  REQUIRE_OK(testing::RestartEtcd(&*etcd));
  absl::StatusOr<std::optional<EtcdKeyValue>> kv = c->Get("/durable");
  REQUIRE_OK(kv.status());
  REQUIRE(kv->has_value());
  CHECK((*kv)->value == "yes");
  // A new stream renews the lease, which etcd kept through its restart.
  stream = c->OpenLeaseStream();
  absl::StatusOr<absl::Duration> left = stream->Renew(*lease);
  REQUIRE_OK(left.status());
  CHECK(*left > absl::Seconds(20));
}

}  // namespace
}  // namespace asyncps
