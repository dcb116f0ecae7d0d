// Steps of the real-time clock (testing::StepRealTime: an operator's
// `date -s`, NTP after a suspend) must neither let a lapsed lease look held
// nor lose a held one, nor end a worker's lease: leases, the role's and the
// workers' times are monotonic (Clock::Monotonic). In-process steps do not
// reach the kernel's timed waits; tests/cluster/clock_step.py steps a
// machine's clock under real processes, where they count too
// (common/steady_wait.h).
#include <signal.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <thread>

#include "absl/time/clock.h"
#include "client/driven_queue.h"
#include "client/ps_client.h"
#include "common/clock.h"
#include "common/logging.h"
#include "membership/lease_keeper.h"
#include "server/worker_registry.h"
#include "tests/testing/alarm_op.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/real_time_step.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/shard_maps.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

// Steps the real-time clock for one test case and back at its end.
struct Stepped {
  explicit Stepped(absl::Duration by) : by(by) { testing::StepRealTime(by); }
  ~Stepped() { testing::StepRealTime(-by); }
  const absl::Duration by;
};

// A 1 s lease in the test's etcd, its losses and renewals counted.
struct CountedLease {
  std::shared_ptr<EtcdClient> etcd;
  std::atomic<int> lost{0};
  std::atomic<int> renewed{0};  // the grant included
  std::unique_ptr<LeaseKeeper> keeper;
};

void StartLease(const testing::EtcdProcess& etcd, CountedLease* l) {
  EtcdClientOptions eo;
  eo.call_timeout = absl::Milliseconds(500);
  absl::StatusOr<std::shared_ptr<EtcdClient>> c =
      testing::ConnectToEtcd(etcd, eo);
  REQUIRE_OK(c.status());
  l->etcd = *std::move(c);
  LeaseKeeperOptions o;
  o.etcd = l->etcd.get();
  o.ttl = absl::Seconds(1);
  o.on_lost = [l] { ++l->lost; };
  o.on_renewed = [l](absl::Time) { ++l->renewed; };
  absl::StatusOr<std::unique_ptr<LeaseKeeper>> keeper = LeaseKeeper::Start(o);
  REQUIRE_OK(keeper.status());
  l->keeper = *std::move(keeper);
}

TEST_CASE("a lease follows etcd, not steps of the real-time clock",
          "[clock][lease]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  CountedLease lease;
  StartLease(*etcd, &lease);
  CHECK(lease.renewed == 1);  // the grant

  SECTION("held through steps of 30 s either way") {
    // Forward: a keeper on the real-time clock saw its expiry 30 s past.
    // Back: its renewal thread slept 30 s (etcd let the lease go) while
    // Held() said true.
    for (const absl::Duration step : {absl::Seconds(30), absl::Seconds(-30)}) {
      INFO("stepped by " << absl::FormatDuration(step));
      Stepped stepped(step);
      const absl::Time until = Clock::Monotonic()->Now() + absl::Seconds(3);
      while (Clock::Monotonic()->Now() < until) {
        REQUIRE(lease.keeper->Held());
        absl::SleepFor(absl::Milliseconds(100));
      }
    }
    CHECK(lease.lost == 0);
    CHECK(lease.renewed > 5);  // every ttl / 3 for 6 s: about 18
    // etcd agrees: the lease is alive, its key with it.
    REQUIRE_OK(lease.etcd->Put("/servers/a", "x", lease.keeper->id()).status());
  }

  SECTION("lost once etcd stops renewing it, though the clock went back") {
    // The clock goes back 30 s, then etcd stops answering (SIGSTOP: its
    // connections stay open): on the real-time clock the lease looked held
    // for 30 s more, while etcd let it go after one.
    Stepped stepped(absl::Seconds(-30));
    REQUIRE(kill(etcd->process->pid(), SIGSTOP) == 0);
    const absl::Time stopped = Clock::Monotonic()->Now();
    // Never promised past one TTL (etcd's 1 s) after the last answer.
    CHECK(lease.keeper->HeldUntil() <= stopped + absl::Seconds(1));
    REQUIRE_OK(testing::WaitFor([&] { return !lease.keeper->Held(); },
                                absl::Seconds(5), "the lease to lapse"));
    REQUIRE_OK(testing::WaitFor([&] { return lease.lost.load() == 1; },
                                absl::Seconds(5), "on_lost"));
    REQUIRE(kill(etcd->process->pid(), SIGCONT) == 0);
  }
}

TEST_CASE("a worker is not evicted by a step of the real-time clock forward",
          "[clock][workers]") {
  RegistryOptions o;  // the default clock
  o.worker_lease = absl::Seconds(5);
  o.background_thread = false;
  o.logger = NullLogger();
  absl::StatusOr<std::unique_ptr<WorkerRegistry>> r = WorkerRegistry::Create(o);
  REQUIRE_OK(r.status());
  WorkerRef w;
  w.set_worker_id(0);
  w.set_incarnation(7);
  REQUIRE_OK((*r)->Admit(w).status());
  Stepped stepped(absl::Seconds(60));
  (*r)->Tick();
  REQUIRE((*r)->Workers().size() == 1);
  CHECK((*r)->Workers()[0].live);
  CHECK((*r)->Workers()[0].silent_for < absl::Seconds(5));
}

TEST_CASE(
    "a client's wait and its queue's idle driver keep their times through a "
    "step of the real-time clock back",
    "[clock]") {
  Clock* const steady = Clock::Monotonic();
  DrivenQueue queue(/*idle_after=*/absl::Milliseconds(100));
  // A wait the clock goes back in the middle of ends at its timeout (on
  // the real-time clock it would last the step longer).
  std::thread stepper([] {
    absl::SleepFor(absl::Milliseconds(200));
    testing::StepRealTime(absl::Seconds(-30));
  });
  absl::Time t0 = steady->Now();
  const bool ready = queue.WaitUntil(absl::Seconds(3), [] { return false; });
  const absl::Duration waited = steady->Now() - t0;
  stepper.join();
  CHECK_FALSE(ready);
  CHECK(waited < absl::Seconds(15));  // 3 s, and the step's lag
  // A wait ends, then the clock goes back 30 s more: on the real-time
  // clock that wait looks 30 s ahead. The idle thread must still take
  // over once nobody has waited for 100 ms and run what completes with no
  // waiter (a slice it was driving in when the step came ends within 1 s).
  queue.WaitUntil(absl::Milliseconds(10), [] { return false; });
  testing::StepRealTime(absl::Seconds(-30));
  absl::SleepFor(absl::Milliseconds(1500));
  t0 = steady->Now();
  testing::AlarmOp op(&queue, absl::Milliseconds(50));
  while (!op.done() && steady->Now() - t0 < absl::Seconds(40)) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  const absl::Duration ran_after = steady->Now() - t0;
  testing::StepRealTime(absl::Seconds(60));
  CHECK(op.done());
  CHECK(ran_after < absl::Seconds(10));  // 50 ms and a look
}

TEST_CASE(
    "a client's call gives up at its deadline through a step of the "
    "real-time clock back",
    "[clock]") {
  // Port 1 on loopback: nothing listens, so the wait retries until its
  // deadline.
  PsClientOptions o;
  o.servers = {"127.0.0.1:1"};
  o.logger = NullLogger();
  absl::StatusOr<std::unique_ptr<PsClient>> client = PsClient::Connect(o);
  REQUIRE_OK(client.status());
  std::thread stepper([] {
    absl::SleepFor(absl::Milliseconds(200));
    testing::StepRealTime(absl::Seconds(-30));
  });
  Clock* const steady = Clock::Monotonic();
  const absl::Time t0 = steady->Now();
  const absl::Status s = (*client)->WaitForShards(absl::Seconds(3));
  const absl::Duration waited = steady->Now() - t0;
  stepper.join();
  testing::StepRealTime(absl::Seconds(30));
  INFO(s.ToString());
  CHECK_FALSE(s.ok());
  CHECK(waited < absl::Seconds(15));  // 3 s, and the step's lag
}

}  // namespace
}  // namespace asyncps
