// A cluster of three real etcd processes on loopback, one member stopped
// (SIGSTOP: its connections stay open and nothing answers, as with a host
// cut off without a word) or left without a leader: a client's calls, its
// lease and its watches go on at another member, and a watch on a member
// without a leader ends instead of staying open with nothing to deliver.
#include <catch2/catch.hpp>
#include <csignal>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "membership/etcd_client.h"
#include "membership/lease_keeper.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

// What a watch delivered.
struct Seen {
  absl::Mutex mu;
  int events ABSL_GUARDED_BY(mu) = 0;
  absl::Status end ABSL_GUARDED_BY(mu);
  bool ended ABSL_GUARDED_BY(mu) = false;

  int Events() {
    absl::MutexLock l(&mu);
    return events;
  }
  bool Ended() {
    absl::MutexLock l(&mu);
    return ended;
  }
};

std::unique_ptr<EtcdClient::Watcher> Watch(EtcdClient* c,
                                           const std::string& prefix,
                                           Seen* seen) {
  return c->WatchPrefix(
      prefix, 0,
      [seen](const std::vector<EtcdEvent>& events, int64_t) {
        absl::MutexLock l(&seen->mu);
        seen->events += static_cast<int>(events.size());
      },
      [seen](const absl::Status& s) {
        absl::MutexLock l(&seen->mu);
        seen->end = s;
        seen->ended = true;
      });
}

// A client of `endpoints`; watches check every 200 ms and calls give up
// after 1 s.
std::unique_ptr<EtcdClient> Connect(std::vector<std::string> endpoints) {
  EtcdClientOptions o;
  o.endpoints = std::move(endpoints);
  o.call_timeout = absl::Seconds(1);
  o.watch_check_every = absl::Milliseconds(200);
  absl::StatusOr<std::unique_ptr<EtcdClient>> c = EtcdClient::Connect(o);
  REQUIRE_OK(c.status());
  return *std::move(c);
}

// Every member's endpoint, `first`'s first.
std::vector<std::string> Endpoints(
    const std::vector<testing::EtcdProcess>& cluster, size_t first) {
  std::vector<std::string> endpoints;
  for (size_t i = 0; i < cluster.size(); ++i) {
    endpoints.push_back(cluster[(first + i) % cluster.size()].endpoint);
  }
  return endpoints;
}

// The index of a member that is not the leader.
size_t AFollower(const std::vector<testing::EtcdProcess>& cluster) {
  for (size_t i = 0; i < cluster.size(); ++i) {
    absl::StatusOr<bool> leader = testing::EtcdIsLeader(cluster[i]);
    REQUIRE_OK(leader.status());
    if (!*leader) return i;
  }
  FAIL("every member says it leads");
  return 0;
}

TEST_CASE(
    "an etcd member that stops answering costs a client nothing: its calls, "
    "its lease and its watch go on at another member",
    "[etcd][faults]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<std::vector<testing::EtcdProcess>> cluster =
      testing::StartEtcdCluster(3);
  REQUIRE_OK(cluster.status());
  // A follower stops (a stopped leader costs an election, which a 1 s
  // lease need not outlive).
  const size_t stopped = AFollower(*cluster);
  testing::EtcdProcess& victim = (*cluster)[stopped];
  auto c = Connect(Endpoints(*cluster, stopped));
  REQUIRE(c->current_endpoint() == victim.endpoint);
  int lost = 0;
  absl::Mutex lost_mu;
  LeaseKeeperOptions lo;
  lo.etcd = c.get();
  lo.ttl = absl::Seconds(1);
  lo.on_lost = [&] {
    absl::MutexLock l(&lost_mu);
    ++lost;
  };
  absl::StatusOr<std::unique_ptr<LeaseKeeper>> lease = LeaseKeeper::Start(lo);
  REQUIRE_OK(lease.status());
  REQUIRE_OK(c->Put("/live/member", "a", (*lease)->id()).status());
  Seen seen;
  auto w = Watch(c.get(), "/live/", &seen);
  absl::SleepFor(absl::Milliseconds(300));  // the watch exists

  REQUIRE_OK(victim.process->Signal(SIGSTOP));
  const absl::Time t0 = absl::Now();
  // The first call may time out (1 s); the next goes to another member.
  int failures = 0;
  for (;;) {
    if (c->Put("/live/x", "1").ok()) break;
    ++failures;
    REQUIRE(absl::Now() - t0 < absl::Seconds(10));
  }
  CHECK(failures <= 1);
  CHECK(c->current_endpoint() != victim.endpoint);
  // The watch on the stopped member ends (its progress request
  // unanswered); a new one, on the member in use, sees what changes.
  REQUIRE_OK(testing::WaitFor([&] { return seen.Ended(); }, absl::Seconds(10),
                              "the watch on the stopped member to end"));
  Seen again;
  auto w2 = Watch(c.get(), "/live/", &again);
  absl::SleepFor(absl::Milliseconds(300));
  REQUIRE_OK(c->Put("/live/y", "1").status());
  REQUIRE_OK(testing::WaitFor([&] { return again.Events() == 1; },
                              absl::Seconds(10), "the event on the new watch"));
  // The lease was renewed through it all, and stays so.
  while (absl::Now() - t0 < absl::Seconds(4)) {
    REQUIRE((*lease)->Held());
    absl::SleepFor(absl::Milliseconds(50));
  }
  {
    absl::MutexLock l(&lost_mu);
    CHECK(lost == 0);
  }
  absl::StatusOr<std::optional<EtcdKeyValue>> member = c->Get("/live/member");
  REQUIRE_OK(member.status());
  CHECK(member->has_value());
  REQUIRE_OK(victim.process->Signal(SIGCONT));
}

TEST_CASE(
    "an etcd member that is down costs no call its deadline: calls go to a "
    "member that is up",
    "[etcd][faults]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<std::vector<testing::EtcdProcess>> cluster =
      testing::StartEtcdCluster(3);
  REQUIRE_OK(cluster.status());
  // Killed: its port refuses connections (a crashed process, a restarting
  // pod), unlike a stopped one that leaves them open and silent.
  const size_t killed = AFollower(*cluster);
  testing::EtcdProcess& victim = (*cluster)[killed];
  REQUIRE_OK(victim.process->Signal(SIGKILL));
  REQUIRE_OK(victim.process->Wait(absl::Seconds(10)).status());
  // The killed member first, as a client's list may well have it; calls
  // could wait 8 s for it.
  EtcdClientOptions o;
  o.endpoints = Endpoints(*cluster, killed);
  o.call_timeout = absl::Seconds(8);
  absl::StatusOr<std::unique_ptr<EtcdClient>> c = EtcdClient::Connect(o);
  REQUIRE_OK(c.status());
  // A read goes on to the next member within its call.
  REQUIRE_OK((*c)->Get("/down/x").status());
  CHECK((*c)->current_endpoint() != victim.endpoint);
  c = EtcdClient::Connect(o);
  REQUIRE_OK(c.status());
  std::vector<absl::Status> failures;
  const absl::Time t0 = absl::Now();
  for (;;) {
    absl::Status s = (*c)->Put("/down/x", "1").status();
    if (s.ok()) break;
    failures.push_back(s);
    REQUIRE(absl::Now() - t0 < absl::Seconds(30));
  }
  // At most one call failed, at once (UNAVAILABLE), not by its deadline.
  CHECK(failures.size() <= 1);
  for (const absl::Status& s : failures) {
    INFO(s.ToString());
    CHECK(absl::IsUnavailable(s));
  }
  CHECK((*c)->current_endpoint() != victim.endpoint);
  // A lease of 1 s is granted and kept through the member that is up.
  LeaseKeeperOptions lo;
  lo.etcd = c->get();
  lo.ttl = absl::Seconds(1);
  absl::StatusOr<std::unique_ptr<LeaseKeeper>> lease = LeaseKeeper::Start(lo);
  REQUIRE_OK(lease.status());
  const absl::Time t1 = absl::Now();
  while (absl::Now() - t1 < absl::Seconds(3)) {
    REQUIRE((*lease)->Held());
    absl::SleepFor(absl::Milliseconds(50));
  }
  lease->reset();
  // A member in use that stops answering (the other follower) moves the
  // calls on past the one that is down, to the third (the leader).
  size_t stopped = (killed + 1) % 3;
  absl::StatusOr<bool> leads = testing::EtcdIsLeader((*cluster)[stopped]);
  REQUIRE_OK(leads.status());
  if (*leads) stopped = (killed + 2) % 3;
  const size_t third = 3 - killed - stopped;
  o.endpoints = {(*cluster)[stopped].endpoint, victim.endpoint,
                 (*cluster)[third].endpoint};
  o.call_timeout = absl::Seconds(1);
  c = EtcdClient::Connect(o);
  REQUIRE_OK(c.status());
  REQUIRE_OK((*c)->Put("/down/y", "1").status());
  REQUIRE_OK((*cluster)[stopped].process->Signal(SIGSTOP));
  CHECK(absl::IsDeadlineExceeded((*c)->Put("/down/y", "2").status()));
  // (Not written to: one member of three left has no quorum.)
  CHECK((*c)->current_endpoint() == (*cluster)[third].endpoint);
  REQUIRE_OK((*cluster)[stopped].process->Signal(SIGCONT));
}

TEST_CASE(
    "a watch on an etcd member that lost its cluster's leader ends, though "
    "the member still answers its progress requests",
    "[etcd][faults]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<std::vector<testing::EtcdProcess>> cluster =
      testing::StartEtcdCluster(3);
  REQUIRE_OK(cluster.status());
  auto c = Connect({(*cluster)[0].endpoint});
  Seen seen;
  auto w = Watch(c.get(), "/cut/", &seen);
  REQUIRE_OK(c->Put("/cut/k", "1").status());
  REQUIRE_OK(testing::WaitFor([&] { return seen.Events() == 1; },
                              absl::Seconds(10), "the event before the cut"));
  // Member 0 alone: it loses the leader within an election timeout (0.5 s)
  // and ends the streams that asked for one after 3 more.
  REQUIRE_OK((*cluster)[1].process->Signal(SIGSTOP));
  REQUIRE_OK((*cluster)[2].process->Signal(SIGSTOP));
  REQUIRE_OK(testing::WaitFor([&] { return seen.Ended(); }, absl::Seconds(15),
                              "the watch on the leaderless member to end"));
  {
    absl::MutexLock l(&seen.mu);
    CHECK(!seen.end.ok());
    CHECK_THAT(std::string(seen.end.message()),
               !Catch::Contains("progress request"));
  }
  REQUIRE_OK((*cluster)[1].process->Signal(SIGCONT));
  REQUIRE_OK((*cluster)[2].process->Signal(SIGCONT));
}

}  // namespace
}  // namespace asyncps
