#include <atomic>
#include <memory>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "server/push_dedup.h"
#include "server/worker_table.h"

namespace asyncps {
namespace {

// A clock the test moves by hand.
class FakeClock {
 public:
  absl::Time Now() {
    absl::MutexLock l(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock l(&mu_);
    now_ += d;
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ = absl::FromUnixSeconds(1000);
};

WorkerRef Ref(int id, int64_t clock, uint64_t incarnation = 1) {
  WorkerRef w;
  w.set_worker_id(id);
  w.set_incarnation(incarnation);
  w.set_clock(clock);
  return w;
}

struct Fixture {
  explicit Fixture(Consistency c, int64_t slack = 0) {
    ConsistencyOptions o;
    o.consistency = c;
    o.ssp_slack = slack;
    o.worker_lease = absl::Seconds(5);
    o.pull_wait_timeout = absl::Seconds(30);
    o.now = [this] { return clock.Now(); };
    o.logger = NullLogger();
    table = WorkerTable::Create(o).value();
  }
  FakeClock clock;
  std::unique_ptr<WorkerTable> table;
};

// Records the outcome of one WhenReady.
struct Outcome {
  std::atomic<bool> done{false};
  absl::Status status;
  WorkerTable::Callback Callback() {
    return [this](absl::Status s) {
      status = s;
      done = true;
    };
  }
};

TEST_CASE("SSP: a pull waits while a worker is more than slack behind",
          "[ssp]") {
  Fixture f(SSP, 2);
  REQUIRE(f.table->Touch(Ref(0, 5), 5, false).ok());
  REQUIRE(f.table->Touch(Ref(1, 2), 2, false).ok());  // 3 behind worker 0
  Outcome pull;
  REQUIRE(f.table->WhenReady(0, 5, pull.Callback()));  // needs min clock >= 3
  REQUIRE_FALSE(pull.done);
  REQUIRE(f.table->waiting() == 1);
  REQUIRE(f.table->Touch(Ref(1, 3), 3, /*push=*/true).ok());  // within 2 now
  REQUIRE(pull.done);
  REQUIRE(pull.status.ok());
  REQUIRE(f.table->waiting() == 0);
  // Exactly at the slack: no wait.
  Outcome at_slack;
  REQUIRE_FALSE(f.table->WhenReady(0, 5, at_slack.Callback()));
  REQUIRE(at_slack.done);
}

TEST_CASE("BSP: no worker may start clock c+1 before all finished c",
          "[bsp]") {
  Fixture f(BSP);
  REQUIRE(f.table->Touch(Ref(0, 0), 0, false).ok());
  REQUIRE(f.table->Touch(Ref(1, 0), 0, false).ok());
  REQUIRE(f.table->Touch(Ref(0, 0), 1, true).ok());  // worker 0 pushed step 0
  Outcome pull;
  REQUIRE(f.table->WhenReady(0, 1, pull.Callback()));
  REQUIRE_FALSE(pull.done);
  REQUIRE(f.table->Touch(Ref(1, 0), 1, true).ok());
  REQUIRE(pull.done);
}

TEST_CASE("ASP never waits", "[asp]") {
  Fixture f(ASP);
  REQUIRE(f.table->Touch(Ref(0, 100), 100, false).ok());
  REQUIRE(f.table->Touch(Ref(1, 0), 0, false).ok());
  Outcome pull;
  REQUIRE_FALSE(f.table->WhenReady(0, 100, pull.Callback()));
  REQUIRE(pull.done);
}

TEST_CASE("an expired lease evicts the worker and releases waiters",
          "[lease]") {
  Fixture f(SSP, 1);
  REQUIRE(f.table->Touch(Ref(0, 10), 10, false).ok());
  REQUIRE(f.table->Touch(Ref(1, 0), 0, false).ok());
  Outcome pull;
  REQUIRE(f.table->WhenReady(0, 10, pull.Callback()));
  f.clock.Advance(absl::Seconds(3));
  REQUIRE(f.table->Touch(Ref(0, 10), 10, false).ok());  // 0 stays fresh
  f.table->Tick();
  REQUIRE_FALSE(pull.done);  // lease (5 s) not yet expired for worker 1
  f.clock.Advance(absl::Seconds(3));
  f.table->Tick();
  REQUIRE(pull.done);
  REQUIRE(pull.status.ok());
  REQUIRE(f.table->evictions() == 1);
  auto workers = f.table->Workers();
  REQUIRE(workers.size() == 2);
  REQUIRE_FALSE(workers[1].live);
  // It comes back: it counts again and holds the others back.
  REQUIRE(f.table->Touch(Ref(1, 1), 1, false).ok());
  REQUIRE(f.table->Workers()[1].live);
  Outcome again;
  REQUIRE(f.table->WhenReady(0, 10, again.Callback()));
  REQUIRE_FALSE(again.done);
  f.table->Shutdown();
  REQUIRE(again.done);
  REQUIRE(again.status.code() == absl::StatusCode::kUnavailable);
}

TEST_CASE("a worker waiting in a pull keeps its lease", "[lease]") {
  Fixture f(BSP);
  REQUIRE(f.table->Touch(Ref(0, 1), 1, false).ok());
  REQUIRE(f.table->Touch(Ref(1, 0), 0, false).ok());
  Outcome pull;
  REQUIRE(f.table->WhenReady(0, 1, pull.Callback()));
  for (int i = 0; i < 4; ++i) {  // 8 s > the 5 s lease; worker 1 heartbeats
    f.clock.Advance(absl::Seconds(2));
    REQUIRE(f.table->Touch(Ref(1, 0), 0, false).ok());
    f.table->Tick();
  }
  REQUIRE_FALSE(pull.done);
  REQUIRE(f.table->evictions() == 0);
  REQUIRE(f.table->Workers()[0].live);
}

TEST_CASE("a leaving worker stops holding others back", "[lease]") {
  Fixture f(BSP);
  REQUIRE(f.table->Touch(Ref(0, 4), 4, false).ok());
  REQUIRE(f.table->Touch(Ref(1, 1), 1, false).ok());
  Outcome pull;
  REQUIRE(f.table->WhenReady(0, 4, pull.Callback()));
  REQUIRE(f.table->Leave(Ref(1, 1)).ok());
  REQUIRE(pull.done);
  REQUIRE(f.table->Workers()[1].left);
}

TEST_CASE("a wait past its deadline fails with DEADLINE_EXCEEDED", "[ssp]") {
  Fixture f(SSP, 0);
  REQUIRE(f.table->Touch(Ref(0, 2), 2, false).ok());
  REQUIRE(f.table->Touch(Ref(1, 0), 0, false).ok());
  Outcome pull;
  REQUIRE(f.table->WhenReady(0, 2, pull.Callback()));
  f.clock.Advance(absl::Seconds(4));
  REQUIRE(f.table->Touch(Ref(1, 0), 0, false).ok());  // alive, still slow
  f.clock.Advance(absl::Seconds(27));
  REQUIRE(f.table->Touch(Ref(1, 0), 0, false).ok());
  f.table->Tick();
  REQUIRE(pull.done);
  REQUIRE(pull.status.code() == absl::StatusCode::kDeadlineExceeded);
}

TEST_CASE("clocks never go back; old incarnations are refused", "[workers]") {
  Fixture f(ASP);
  REQUIRE(f.table->Touch(Ref(3, 7, 2), 7, false).ok());
  REQUIRE(f.table->Touch(Ref(3, 5, 2), 5, false).ok());
  REQUIRE(f.table->Workers()[0].clock == 7);
  REQUIRE(f.table->Touch(Ref(3, 9, 1), 9, false).code() ==
          absl::StatusCode::kFailedPrecondition);
  // A restart (newer incarnation) starts from its own clock.
  REQUIRE(f.table->Touch(Ref(3, 0, 3), 0, false).ok());
  REQUIRE(f.table->Workers()[0].clock == 0);
  REQUIRE(f.table->Touch(Ref(-1, 0), 0, false).code() ==
          absl::StatusCode::kInvalidArgument);
  REQUIRE(f.table->Touch(Ref(1, 0, 0), 0, false).code() ==
          absl::StatusCode::kInvalidArgument);
}

TEST_CASE("pushes are applied once per (worker, incarnation, seq)",
          "[dedup]") {
  PushDedup dedup;
  int applied = 0;
  auto apply = [&] { ++applied; };
  REQUIRE(dedup.RunOnce(Ref(0, 0, 1), 1, apply).value());
  REQUIRE_FALSE(dedup.RunOnce(Ref(0, 0, 1), 1, apply).value());  // retry
  REQUIRE(dedup.RunOnce(Ref(0, 0, 1), 2, apply).value());
  REQUIRE_FALSE(dedup.RunOnce(Ref(0, 0, 1), 1, apply).value());  // late retry
  REQUIRE(dedup.RunOnce(Ref(1, 0, 1), 1, apply).value());  // other worker
  REQUIRE(dedup.RunOnce(Ref(0, 0, 2), 1, apply).value());  // restarted
  REQUIRE(dedup.RunOnce(Ref(0, 0, 1), 3, apply).status().code() ==
          absl::StatusCode::kFailedPrecondition);  // zombie
  REQUIRE(applied == 4);
}

}  // namespace
}  // namespace asyncps
