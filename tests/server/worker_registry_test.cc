// The worker registry with a hand-driven clock: identity and fencing,
// resume clocks, leases, consistency waits and their cancellation, push
// de-duplication over a window, checkpoint export/import.

#include "server/worker_registry.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/logging.h"
#include "server/dedup_window.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/require_ok.h"

namespace asyncps {
namespace {

using testing::FakeClock;

WorkerRef Ref(int id, int64_t clock, uint64_t incarnation = 1) {
  WorkerRef w;
  w.set_worker_id(id);
  w.set_incarnation(incarnation);
  w.set_clock(clock);
  return w;
}

struct Fixture {
  explicit Fixture(Consistency c, int64_t slack = 0, int window = 4096) {
    RegistryOptions o;
    o.consistency = c;
    o.ssp_slack = slack;
    o.worker_lease = absl::Seconds(5);
    o.pull_wait_timeout = absl::Seconds(30);
    o.dedup_window = window;
    o.clock = &clock;
    o.background_thread = false;
    o.logger = NullLogger();
    registry = WorkerRegistry::Create(o).value();
  }
  // Admits a call at `clock` (a heartbeat or pull).
  void Admit(int id, int64_t clock, uint64_t incarnation = 1) {
    REQUIRE_OK(registry->Admit(Ref(id, clock, incarnation)).status());
  }
  // A push at `clock` that is applied.
  void Push(int id, int64_t clock, uint64_t seq, uint64_t incarnation = 1) {
    absl::StatusOr<WorkerRegistry::PushClaim> c =
        registry->BeginPush(Ref(id, clock, incarnation), seq);
    REQUIRE_OK(c.status());
    REQUIRE_FALSE(c->duplicate());
    registry->FinishPush(&*c, /*applied=*/true);
  }
  FakeClock clock;
  std::unique_ptr<WorkerRegistry> registry;
};

// Records the outcome of one WhenReady.
struct Outcome {
  std::atomic<bool> done{false};
  absl::Status status;
  WorkerRegistry::Callback Callback() {
    return [this](absl::Status s) {
      status = s;
      done = true;
    };
  }
};

TEST_CASE("SSP: a pull waits while a worker is more than slack behind",
          "[ssp]") {
  Fixture f(SSP, 2);
  // The slow one first: a worker that joins later starts no lower than the
  // slowest live one.
  f.Admit(1, 2);
  f.Admit(0, 5);  // 3 ahead of worker 1
  Outcome pull;
  REQUIRE(f.registry->WhenReady(0, 5, pull.Callback()) != 0);  // needs >= 3
  REQUIRE_FALSE(pull.done);
  REQUIRE(f.registry->waiting() == 1);
  f.Push(1, 2, 1);  // worker 1 completed step 2: clock 3
  REQUIRE(pull.done);
  REQUIRE(pull.status.ok());
  REQUIRE(f.registry->waiting() == 0);
  Outcome at_slack;  // exactly at the slack: no wait
  REQUIRE(f.registry->WhenReady(0, 5, at_slack.Callback()) == 0);
  REQUIRE(at_slack.done);
}

TEST_CASE("BSP: no worker may start clock c+1 before all finished c", "[bsp]") {
  Fixture f(BSP);
  f.Admit(0, 0);
  f.Admit(1, 0);
  f.Push(0, 0, 1);  // worker 0 finished step 0
  Outcome pull;
  REQUIRE(f.registry->WhenReady(0, 1, pull.Callback()) != 0);
  REQUIRE_FALSE(pull.done);
  f.Push(1, 0, 1);
  REQUIRE(pull.done);
  REQUIRE(pull.status.ok());
}

TEST_CASE("a pull for a later step waits for the caller's own push under BSP",
          "[bsp][pipeline]") {
  Fixture f(BSP);
  f.Admit(0, 3);
  f.Admit(1, 4);
  Outcome prefetch;  // worker 0, 3 steps done, reads for step 4
  REQUIRE(f.registry->WhenReady(0, 4, prefetch.Callback()) != 0);
  REQUIRE_FALSE(prefetch.done);
  f.Push(0, 3, 1);
  REQUIRE(prefetch.done);
}

TEST_CASE("ASP never waits", "[asp]") {
  Fixture f(ASP);
  f.Admit(1, 0);
  f.Admit(0, 100);
  Outcome pull;
  REQUIRE(f.registry->WhenReady(0, 100, pull.Callback()) == 0);
  REQUIRE(pull.done);
}

TEST_CASE("an expired lease evicts the worker and releases waiters",
          "[lease]") {
  Fixture f(SSP, 1);
  f.Admit(1, 0);
  f.Admit(0, 10);
  Outcome pull;
  REQUIRE(f.registry->WhenReady(0, 10, pull.Callback()) != 0);
  f.clock.Advance(absl::Seconds(3));
  f.registry->Tick();
  REQUIRE_FALSE(pull.done);  // lease (5 s) not yet expired for worker 1
  f.clock.Advance(absl::Seconds(3));
  f.registry->Tick();
  REQUIRE(pull.done);
  REQUIRE(pull.status.ok());
  REQUIRE(f.registry->counters().evictions == 1);
  std::vector<WorkerInfo> workers = f.registry->Workers();
  REQUIRE(workers.size() == 2);
  REQUIRE_FALSE(workers[1].live);
  // It comes back: it counts again and holds the others back.
  f.Admit(1, 1);
  REQUIRE(f.registry->Workers()[1].live);
  Outcome again;
  REQUIRE(f.registry->WhenReady(0, 10, again.Callback()) != 0);
  REQUIRE_FALSE(again.done);
  f.registry->Shutdown();
  REQUIRE(again.done);
  REQUIRE(again.status.code() == absl::StatusCode::kUnavailable);
}

TEST_CASE(
    "a worker waiting in a pull keeps its lease while its caller is "
    "there",
    "[lease]") {
  Fixture f(BSP);
  f.Admit(1, 0);
  f.Admit(0, 1);
  Outcome pull;
  const WorkerRegistry::WaitId id =
      f.registry->WhenReady(0, 1, pull.Callback());
  REQUIRE(id != 0);
  for (int i = 0; i < 4; ++i) {  // 8 s > the 5 s lease; worker 1 heartbeats
    f.clock.Advance(absl::Seconds(2));
    f.Admit(1, 0);
    f.registry->Tick();
  }
  REQUIRE_FALSE(pull.done);
  REQUIRE(f.registry->counters().evictions == 0);
  REQUIRE(f.registry->Workers()[0].live);
  REQUIRE(f.registry->Workers()[0].waiting_pulls == 1);

  // The caller goes away: the wait ends, and the lease runs out as usual.
  f.registry->CancelWait(id);
  REQUIRE(pull.done);
  REQUIRE(pull.status.code() == absl::StatusCode::kCancelled);
  REQUIRE(f.registry->counters().cancelled_pulls == 1);
  REQUIRE(f.registry->Workers()[0].waiting_pulls == 0);
  f.registry->CancelWait(id);  // a second cancel is a no-op
  f.clock.Advance(absl::Seconds(4));
  f.Admit(1, 0);
  f.registry->Tick();
  REQUIRE(f.registry->Workers()[0].live);
  f.clock.Advance(absl::Seconds(2));  // 6 s since the wait ended
  f.Admit(1, 0);
  f.registry->Tick();
  REQUIRE_FALSE(f.registry->Workers()[0].live);
  REQUIRE(f.registry->counters().evictions == 1);
}

TEST_CASE("a leaving worker stops holding others back", "[lease]") {
  Fixture f(BSP);
  f.Admit(1, 1);
  f.Admit(0, 4);
  Outcome pull;
  REQUIRE(f.registry->WhenReady(0, 4, pull.Callback()) != 0);
  REQUIRE_OK(f.registry->Leave(Ref(1, 1)));
  REQUIRE(pull.done);
  REQUIRE(f.registry->Workers()[1].left);
}

TEST_CASE("a wait past its deadline fails with DEADLINE_EXCEEDED", "[ssp]") {
  Fixture f(SSP, 0);
  f.Admit(1, 0);
  f.Admit(0, 2);
  Outcome pull;
  REQUIRE(f.registry->WhenReady(0, 2, pull.Callback()) != 0);
  f.clock.Advance(absl::Seconds(4));
  f.Admit(1, 0);  // alive, still slow
  f.clock.Advance(absl::Seconds(27));
  f.Admit(1, 0);
  f.registry->Tick();
  REQUIRE(pull.done);
  REQUIRE(pull.status.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(pull.status.message().find("behind: worker 1 at clock 0") !=
        std::string::npos);
}

TEST_CASE("a new incarnation replaces the old one whatever their values",
          "[identity]") {
  Fixture f(ASP);
  // Incarnations are random: a restart may draw a smaller number.
  std::mt19937_64 rng(7);
  uint64_t current = rng() | 1;
  f.Admit(3, 0, current);
  std::vector<uint64_t> replaced;
  for (int restart = 0; restart < 20; ++restart) {
    const uint64_t next = rng() | 1;
    absl::StatusOr<WorkerRegistry::Admission> a =
        f.registry->Admit(Ref(3, 0, next));
    REQUIRE_OK(a.status());
    REQUIRE(a->new_incarnation);
    replaced.push_back(current);
    current = next;
  }
  REQUIRE(f.registry->counters().restarts == 20);
  REQUIRE(f.registry->Workers()[0].incarnation == current);
  REQUIRE(f.registry->Workers()[0].restarts == 20);
  // The most recent replaced incarnations are fenced: refused, nothing
  // changes (the live incarnation stays).
  absl::Status zombie = f.registry->Admit(Ref(3, 99, replaced.back())).status();
  REQUIRE(zombie.code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(
      f.registry->BeginPush(Ref(3, 99, replaced.back()), 1).status().code() ==
      absl::StatusCode::kFailedPrecondition);
  REQUIRE(f.registry->Leave(Ref(3, 99, replaced.back())).code() ==
          absl::StatusCode::kFailedPrecondition);
  REQUIRE(f.registry->Workers()[0].incarnation == current);
  REQUIRE(f.registry->Workers()[0].clock == 0);
  REQUIRE(f.registry->counters().fenced_calls == 3);
}

TEST_CASE(
    "a restarted worker resumes at the larger of its predecessor's and "
    "the slowest live clock",
    "[identity][ssp]") {
  Fixture f(SSP, 3);
  f.Admit(0, 40);
  f.Admit(1, 50);
  f.Admit(2, 45);
  // Worker 1 restarts (clock 0 in the new process): its predecessor reached
  // 50, so it goes on from 50.
  absl::StatusOr<WorkerRegistry::Admission> a = f.registry->Admit(Ref(1, 0, 2));
  REQUIRE_OK(a.status());
  REQUIRE(a->clock == 50);
  REQUIRE(a->previous_clock == 50);
  // Worker 0 is evicted meanwhile, the others run on; its restart starts at
  // the slowest live clock, not at 40, so nobody waits for it.
  f.clock.Advance(absl::Seconds(6));
  f.Admit(1, 60, 2);
  f.Admit(2, 58);
  f.registry->Tick();
  REQUIRE_FALSE(f.registry->Workers()[0].live);
  a = f.registry->Admit(Ref(0, 0, 9));
  REQUIRE_OK(a.status());
  REQUIRE(a->clock == 58);
  REQUIRE(a->previous_clock == 40);
  // A brand-new worker id joins at the slowest live clock too.
  a = f.registry->Admit(Ref(7, 0, 1));
  REQUIRE_OK(a.status());
  REQUIRE(a->clock == 58);
  REQUIRE(a->previous_clock == 0);
  // Clocks never go back within an incarnation.
  f.Admit(2, 10);
  REQUIRE(f.registry->Workers()[2].clock == 58);
}

TEST_CASE("malformed worker refs are INVALID_ARGUMENT", "[identity]") {
  Fixture f(ASP);
  REQUIRE(f.registry->Admit(Ref(-1, 0)).status().code() ==
          absl::StatusCode::kInvalidArgument);
  REQUIRE(f.registry->Admit(Ref(1, 0, 0)).status().code() ==
          absl::StatusCode::kInvalidArgument);
  REQUIRE(f.registry->Admit(Ref(1, -5)).status().code() ==
          absl::StatusCode::kInvalidArgument);
  REQUIRE(f.registry->BeginPush(Ref(1, 0), 0).status().code() ==
          absl::StatusCode::kInvalidArgument);
  REQUIRE(f.registry->Workers().empty());
}

TEST_CASE(
    "pushes are applied once per (worker, incarnation, seq), in any "
    "order",
    "[dedup]") {
  Fixture f(ASP);
  auto claim = [&](int id, uint64_t inc, uint64_t seq) {
    absl::StatusOr<WorkerRegistry::PushClaim> c =
        f.registry->BeginPush(Ref(id, 0, inc), seq);
    REQUIRE_OK(c.status());
    return *c;
  };
  // Out of order: 3 arrives before 1 and 2; none is mistaken for a retry.
  for (uint64_t seq : {3, 1, 2}) {
    WorkerRegistry::PushClaim c = claim(0, 1, seq);
    REQUIRE_FALSE(c.duplicate());
    f.registry->FinishPush(&c, true);
  }
  for (uint64_t seq : {1, 2, 3}) REQUIRE(claim(0, 1, seq).duplicate());
  // A push that failed validation may be tried again.
  WorkerRegistry::PushClaim bad = claim(0, 1, 4);
  f.registry->FinishPush(&bad, false);
  WorkerRegistry::PushClaim retry = claim(0, 1, 4);
  REQUIRE_FALSE(retry.duplicate());
  f.registry->FinishPush(&retry, true);
  REQUIRE(claim(0, 1, 4).duplicate());
  // Another worker id has its own sequence; a restart starts a fresh one.
  REQUIRE_FALSE(claim(1, 1, 1).duplicate());
  WorkerRegistry::PushClaim restarted = claim(0, 2, 1);
  REQUIRE_FALSE(restarted.duplicate());
  f.registry->FinishPush(&restarted, true);
  REQUIRE(f.registry->Workers()[0].pushes == 5);
  REQUIRE(f.registry->Workers()[0].clock == 1);
}

TEST_CASE("a retry racing its original waits for it and is a duplicate",
          "[dedup]") {
  Fixture f(ASP);
  absl::StatusOr<WorkerRegistry::PushClaim> original =
      f.registry->BeginPush(Ref(0, 0), 7);
  REQUIRE_OK(original.status());
  absl::Notification retried;
  bool duplicate = false;
  std::thread retry([&] {
    absl::StatusOr<WorkerRegistry::PushClaim> c =
        f.registry->BeginPush(Ref(0, 0), 7);
    duplicate = c.ok() && c->duplicate();
    retried.Notify();
  });
  // The retry cannot finish while the original is being applied.
  REQUIRE_FALSE(retried.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  f.registry->FinishPush(&*original, true);
  retry.join();
  REQUIRE(duplicate);
}

TEST_CASE("the de-dup window slides; what it passes counts as settled",
          "[dedup]") {
  DedupWindow w(8);
  REQUIRE(w.Check(1) == DedupWindow::State::kNew);
  for (uint64_t s : {2, 3, 5}) {
    w.Begin(s);
    REQUIRE(w.Check(s) == DedupWindow::State::kInFlight);
    w.Applied(s);
  }
  REQUIRE(w.base() == 0);  // 1 is missing
  REQUIRE(w.Check(1) == DedupWindow::State::kNew);
  w.Applied(1);
  REQUIRE(w.base() == 3);
  REQUIRE(w.Check(4) == DedupWindow::State::kNew);
  REQUIRE(w.AppliedAboveBase() == std::vector<uint64_t>{5});
  // Far ahead: the window moves so that 20 is its last entry.
  w.Applied(20);
  REQUIRE(w.base() == 12);
  REQUIRE(w.Check(4) == DedupWindow::State::kApplied);  // settled
  REQUIRE(w.Check(13) == DedupWindow::State::kNew);
  REQUIRE(w.Check(20) == DedupWindow::State::kApplied);
  DedupWindow copy(8);
  copy.Import(w.base(), w.AppliedAboveBase());
  REQUIRE(copy.base() == 12);
  REQUIRE(copy.Check(20) == DedupWindow::State::kApplied);
  REQUIRE(copy.Check(13) == DedupWindow::State::kNew);
}

TEST_CASE("export and import keep identities, clocks and applied pushes",
          "[checkpoint]") {
  Fixture f(SSP, 1);
  f.Admit(0, 0, 11);
  f.Admit(0, 0, 12);  // restart: 11 is retired
  f.Push(0, 4, 1, 12);
  f.Push(0, 5, 3, 12);
  f.Admit(2, 2, 5);
  REQUIRE_OK(f.registry->Leave(Ref(2, 2, 5)));
  const std::vector<CheckpointWorker> records = f.registry->Export();
  REQUIRE(records.size() == 2);

  Fixture g(SSP, 1);
  REQUIRE_OK(g.registry->Import(records));
  const std::vector<WorkerInfo> workers = g.registry->Workers();
  REQUIRE(workers.size() == 2);
  REQUIRE(workers[0].incarnation == 12);
  REQUIRE(workers[0].clock == 6);
  REQUIRE(workers[0].pushes == 2);
  REQUIRE(workers[0].restarts == 1);
  REQUIRE(workers[1].left);
  REQUIRE_FALSE(workers[1].live);
  // Applied pushes stay applied; the gap (seq 2) does not.
  REQUIRE(g.registry->BeginPush(Ref(0, 5, 12), 3)->duplicate());
  REQUIRE(g.registry->BeginPush(Ref(0, 5, 12), 1)->duplicate());
  REQUIRE_FALSE(g.registry->BeginPush(Ref(0, 5, 12), 2)->duplicate());
  // The retired incarnation stays fenced.
  REQUIRE(g.registry->Admit(Ref(0, 0, 11)).status().code() ==
          absl::StatusCode::kFailedPrecondition);
  // Importing twice is refused.
  REQUIRE(g.registry->Import(records).code() ==
          absl::StatusCode::kFailedPrecondition);
}

// A worker record as the shard the slots leave sends it.
MovedWorkerRecord Moved(int id, uint64_t incarnation, int64_t clock,
                        bool live = true, std::vector<uint64_t> retired = {}) {
  MovedWorkerRecord r;
  r.worker_id = id;
  r.incarnation = incarnation;
  r.clock = clock;
  r.live = live;
  r.left = !live;
  r.retired = std::move(retired);
  return r;
}

WorkerInfo Info(const WorkerRegistry& registry, int id) {
  for (const WorkerInfo& w : registry.Workers()) {
    if (w.worker_id == id) return w;
  }
  FAIL("worker " << id << " unknown");
  return WorkerInfo();
}

TEST_CASE("moved records add unknown workers, live only if live there",
          "[moves]") {
  Fixture f(BSP);
  MovedWorkerRecord slow = Moved(1, 21, 2, true, {20});
  slow.trained = 40;
  REQUIRE_OK(f.registry->ImportWorkers(
      {Moved(0, 11, 5), slow, Moved(2, 31, 1, /*live=*/false)}));
  CHECK(Info(*f.registry, 0).incarnation == 11);
  CHECK(Info(*f.registry, 0).clock == 5);
  CHECK(Info(*f.registry, 1).trained == 40);
  CHECK(Info(*f.registry, 2).left);
  CHECK_FALSE(Info(*f.registry, 2).live);
  // The one that left holds nobody back; the slow live one does.
  CHECK(f.registry->MinLiveClock() == 2);
  CHECK(f.registry->IsCurrent(Ref(1, 2, 21)));
  // A process the source saw replaced is fenced here too.
  CHECK(absl::IsFailedPrecondition(f.registry->Admit(Ref(1, 2, 20)).status()));
  // The lease is fresh from the import.
  f.clock.Advance(absl::Seconds(4));
  f.registry->Tick();
  CHECK(Info(*f.registry, 1).live);
  f.clock.Advance(absl::Seconds(2));
  f.registry->Tick();
  CHECK_FALSE(Info(*f.registry, 1).live);
}

TEST_CASE("a fast worker waits on a shard that learnt a slow one's clock",
          "[moves][bsp]") {
  Fixture f(BSP);
  f.Admit(0, 3, 11);  // only the fast worker ever called this shard
  Outcome before;
  REQUIRE(f.registry->WhenReady(0, 3, before.Callback()) == 0);
  REQUIRE_OK(f.registry->ImportWorkers({Moved(1, 21, 1)}));
  Outcome pull;
  REQUIRE(f.registry->WhenReady(0, 3, pull.Callback()) != 0);
  CHECK_FALSE(pull.done);
  // A later move brings the slow worker's progress: the wait is released.
  REQUIRE_OK(f.registry->ImportWorkers({Moved(1, 21, 3)}));
  CHECK(pull.done);
  CHECK(pull.status.ok());
}

TEST_CASE("a moved record of the same incarnation keeps the larger clock",
          "[moves]") {
  Fixture f(SSP, 4);
  f.Admit(0, 4, 11);
  f.Admit(1, 12, 21);
  REQUIRE_OK(f.registry->ImportWorkers({Moved(0, 11, 9), Moved(1, 21, 9)}));
  CHECK(Info(*f.registry, 0).clock == 9);
  CHECK(Info(*f.registry, 1).clock == 12);
  // Evicted here (silent to this shard), live there: live again.
  f.clock.Advance(absl::Seconds(6));
  f.registry->Tick();
  REQUIRE_FALSE(Info(*f.registry, 0).live);
  REQUIRE_OK(f.registry->ImportWorkers({Moved(0, 11, 9)}));
  CHECK(Info(*f.registry, 0).live);
  // One that said it leaves here stays gone.
  REQUIRE_OK(f.registry->Leave(Ref(1, 12, 21)));
  REQUIRE_OK(f.registry->ImportWorkers({Moved(1, 21, 13)}));
  CHECK_FALSE(Info(*f.registry, 1).live);
  CHECK(Info(*f.registry, 1).clock == 13);
}

TEST_CASE("a moved record of another incarnation never fences a newer one",
          "[moves][identity]") {
  Fixture f(SSP, 4);
  SECTION("the record's process was replaced here: ignored") {
    f.Admit(0, 2, 11);
    f.Admit(0, 3, 12);  // 12 replaced 11 here
    REQUIRE_OK(f.registry->ImportWorkers({Moved(0, 11, 30)}));
    CHECK(Info(*f.registry, 0).incarnation == 12);
    CHECK(Info(*f.registry, 0).clock == 3);
    CHECK(f.registry->IsCurrent(Ref(0, 3, 12)));
  }
  SECTION("the source saw this shard's process replaced: the record's wins") {
    f.Admit(0, 2, 11);
    REQUIRE_OK(f.registry->ImportWorkers({Moved(0, 12, 7, true, {11})}));
    CHECK(Info(*f.registry, 0).incarnation == 12);
    CHECK(Info(*f.registry, 0).clock == 7);
    CHECK(Info(*f.registry, 0).restarts == 1);
    CHECK(
        absl::IsFailedPrecondition(f.registry->Admit(Ref(0, 2, 11)).status()));
    CHECK(f.registry->IsCurrent(Ref(0, 7, 12)));
  }
  SECTION("neither shard saw the other's replaced: this shard's stays") {
    f.Admit(0, 2, 11);
    REQUIRE_OK(f.registry->ImportWorkers({Moved(0, 12, 7)}));
    CHECK(Info(*f.registry, 0).incarnation == 11);
    CHECK(Info(*f.registry, 0).clock == 7);  // a worker id's clock only grows
    CHECK(f.registry->IsCurrent(Ref(0, 7, 11)));
    // Whichever calls next is admitted by the usual rules.
    f.Admit(0, 7, 12);
    CHECK(
        absl::IsFailedPrecondition(f.registry->Admit(Ref(0, 7, 11)).status()));
  }
}

TEST_CASE("malformed moved records are INVALID_ARGUMENT and change nothing",
          "[moves]") {
  Fixture f(SSP, 1);
  for (const MovedWorkerRecord& bad :
       {Moved(-1, 1, 0), Moved(0, 0, 0), Moved(0, 1, -2),
        Moved(0, 1, 0, true, {0}), Moved(0, 7, 0, true, {6, 7})}) {
    CHECK(absl::IsInvalidArgument(
        f.registry->ImportWorkers({Moved(3, 5, 1), bad})));
  }
  CHECK(f.registry->Workers().empty());
  // Export gives what the registry holds, for the next move.
  f.Admit(0, 2, 11);
  f.Admit(0, 3, 12);
  REQUIRE_OK(f.registry->Leave(Ref(0, 3, 12)));
  const std::vector<MovedWorkerRecord> out = f.registry->ExportMoved();
  REQUIRE(out.size() == 1);
  CHECK(out[0].incarnation == 12);
  CHECK(out[0].retired == std::vector<uint64_t>{11});
  CHECK(out[0].clock == 3);
  CHECK(out[0].left);
  CHECK_FALSE(out[0].live);
}

// Claims `seq` naming `origins`: whether it is a duplicate (a new claim is
// applied).
bool PushNaming(Fixture* f, int id, uint64_t incarnation, uint64_t seq,
                std::vector<PushOriginRef> origins) {
  absl::StatusOr<WorkerRegistry::PushClaim> c =
      f->registry->BeginPush(Ref(id, 1, incarnation), seq, origins);
  REQUIRE_OK(c.status());
  if (!c->duplicate()) f->registry->FinishPush(&*c, /*applied=*/true);
  return c->duplicate();
}

TEST_CASE(
    "a re-routed part is a duplicate when an origin applied it: moved seqs "
    "for other shards, the own window for this one",
    "[moves][dedup]") {
  Fixture f(ASP);  // shard 0
  MovedWorkerRecord from1 = Moved(0, 11, 3);
  from1.applied_seqs[1] = AppliedSeqSet(2, {5});   // shard 1's window
  from1.applied_seqs[0] = AppliedSeqSet(100, {});  // this shard's: skipped
  from1.applied_seqs[4] = AppliedSeqSet(0, {40});  // brought to shard 1
  REQUIRE_OK(f.registry->ImportWorkers({from1}));
  CHECK(PushNaming(&f, 0, 11, 50, {{1, 5}}));
  CHECK(PushNaming(&f, 0, 11, 51, {{1, 2}}));  // settled below the base
  CHECK(PushNaming(&f, 0, 11, 52, {{7, 1}, {4, 40}}));
  // Not applied at any origin: applied here, once, under its own seq.
  CHECK_FALSE(PushNaming(&f, 0, 11, 53, {{1, 4}, {4, 41}}));
  CHECK(PushNaming(&f, 0, 11, 53, {{1, 4}, {4, 41}}));
  // This shard's own window answers for it (the record's copy was not
  // taken: seq 60 is not settled here).
  CHECK_FALSE(PushNaming(&f, 0, 11, 54, {{0, 60}}));
  CHECK(PushNaming(&f, 0, 11, 55, {{0, 53}}));
  // Seqs of another incarnation are not this one's.
  CHECK_FALSE(PushNaming(&f, 0, 12, 5, {{1, 5}}));

  // The next move out carries the own window (tagged 0) and the moved
  // ones of the current incarnation (12: a fresh start).
  const std::vector<MovedWorkerRecord> out = f.registry->ExportMoved();
  REQUIRE(out.size() == 1);
  CHECK(out[0].incarnation == 12);
  REQUIRE(out[0].applied_seqs.size() == 1);
  CHECK(out[0].applied_seqs.at(0).Holds(5));
  CHECK_FALSE(out[0].applied_seqs.at(0).Holds(4));
}

TEST_CASE("moved seqs merge by union and survive export and import",
          "[moves][dedup][checkpoint]") {
  Fixture f(ASP);
  MovedWorkerRecord early = Moved(0, 11, 3);
  early.applied_seqs[1] = AppliedSeqSet(2, {5, 9});
  MovedWorkerRecord later = Moved(0, 11, 4);
  later.applied_seqs[1] = AppliedSeqSet(6, {9, 12});
  REQUIRE_OK(f.registry->ImportWorkers({early}));
  REQUIRE_OK(f.registry->ImportWorkers({later}));
  f.Push(0, 4, 1, 11);
  const std::vector<CheckpointWorker> saved = f.registry->Export();
  REQUIRE(saved.size() == 1);
  REQUIRE(saved[0].moved_seqs_size() == 1);
  CHECK(saved[0].moved_seqs(0).shard() == 1);
  CHECK(saved[0].moved_seqs(0).base() == 6);
  CHECK(std::vector<uint64_t>(saved[0].moved_seqs(0).applied().begin(),
                              saved[0].moved_seqs(0).applied().end()) ==
        std::vector<uint64_t>{9, 12});

  Fixture g(ASP);
  REQUIRE_OK(g.registry->Import(saved));
  CHECK(PushNaming(&g, 0, 11, 20, {{1, 12}}));
  CHECK(PushNaming(&g, 0, 11, 21, {{1, 6}}));
  CHECK_FALSE(PushNaming(&g, 0, 11, 22, {{1, 7}}));
  // Too many seqs in one record: refused whole.
  MovedWorkerRecord huge = Moved(0, 11, 4);
  std::vector<uint64_t> many(WorkerRegistry::kMaxMovedSeqs + 1);
  for (size_t i = 0; i < many.size(); ++i) many[i] = i + 1;
  huge.applied_seqs[2] = AppliedSeqSet(0, std::move(many));
  CHECK(absl::IsInvalidArgument(g.registry->ImportWorkers({huge})));
  MovedWorkerRecord far = Moved(0, 11, 4);
  far.applied_seqs[70000] = AppliedSeqSet(0, {1});
  CHECK(absl::IsInvalidArgument(g.registry->ImportWorkers({far})));
  CHECK_FALSE(PushNaming(&g, 0, 11, 23, {{2, 1}}));
}

}  // namespace
}  // namespace asyncps
