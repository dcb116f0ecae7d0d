// DrivenQueue: operations complete on the threads that wait for them, one
// driver at a time, and every waiter sees its own condition: after another
// thread's completion, after Notify, at its timeout; while nobody waits,
// the queue's idle thread runs them, and gives way to the next waiter.
// Operations are grpc::Alarm expiries, which complete on a queue like any
// call. The queues of the first cases never go idle within the test.
#include "client/driven_queue.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "absl/time/time.h"
#include "tests/testing/alarm_op.h"

namespace asyncps {
namespace {

using testing::AlarmOp;

TEST_CASE("an operation completes on the thread that waits for it") {
  DrivenQueue queue(absl::Minutes(10));
  AlarmOp op(&queue, absl::Milliseconds(20));
  REQUIRE(queue.WaitUntil(absl::Seconds(10), [&] { return op.done(); }));
  CHECK(op.ok());
  CHECK(op.thread() == std::this_thread::get_id());
}

TEST_CASE("a wait ends at its timeout when nothing completes") {
  DrivenQueue queue(absl::Minutes(10));
  AlarmOp late(&queue, absl::Seconds(30));
  CHECK_FALSE(
      queue.WaitUntil(absl::Milliseconds(50), [&] { return late.done(); }));
  CHECK_FALSE(late.done());
  // A condition that holds already ends the wait at once.
  CHECK(queue.WaitUntil(absl::Seconds(30), [] { return true; }));
}

TEST_CASE("a waiter is woken when the driver runs its completion") {
  DrivenQueue queue(absl::Minutes(10));
  AlarmOp slow(&queue, absl::Seconds(3));
  std::atomic<bool> driving{false};
  bool slow_waited = false;
  std::thread::id driver_id;
  std::thread driver([&] {
    driver_id = std::this_thread::get_id();
    driving.store(true);
    slow_waited =
        queue.WaitUntil(absl::Seconds(20), [&] { return slow.done(); });
  });
  while (!driving.load()) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  AlarmOp fast(&queue, absl::Milliseconds(50));
  REQUIRE(queue.WaitUntil(absl::Seconds(20), [&] { return fast.done(); }));
  // The driver ran it (this thread only waited) and woke this one before
  // its own alarm.
  CHECK_FALSE(slow.done());
  CHECK(fast.thread() == driver_id);
  driver.join();
  CHECK(slow_waited);
  CHECK(slow.thread() == driver_id);
}

TEST_CASE("Notify wakes a waiter whose condition changed elsewhere") {
  DrivenQueue queue(absl::Minutes(10));
  AlarmOp slow(&queue, absl::Seconds(3));
  // The waiter starts once the driver drives (its ready() is first asked
  // under the queue's lock, where it takes the driving): a waiter that
  // got there first would drive itself, and Notify wakes no driver.
  std::atomic<bool> driving{false};
  std::thread driver([&] {
    queue.WaitUntil(absl::Seconds(20), [&] {
      driving.store(true);
      return slow.done();
    });
  });
  while (!driving.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::atomic<bool> flag{false};
  std::atomic<bool> woken{false};
  std::thread waiter([&] {
    woken.store(
        queue.WaitUntil(absl::Seconds(20), [&] { return flag.load(); }));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  flag.store(true);
  queue.Notify();
  waiter.join();
  CHECK(woken.load());
  CHECK_FALSE(slow.done());  // it did not wait for the driver's alarm
  driver.join();
  CHECK(slow.done());
}

TEST_CASE("a wait that ends runs what has completed already") {
  DrivenQueue queue(absl::Minutes(10));
  AlarmOp op(&queue, absl::ZeroDuration());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK_FALSE(op.done());  // nobody drives: it waits in the queue
  CHECK(queue.WaitUntil(absl::Seconds(10), [] { return true; }));
  CHECK(op.done());
}

TEST_CASE("while nobody waits, the idle thread runs completions") {
  DrivenQueue queue(absl::Milliseconds(50));
  AlarmOp op(&queue, absl::Milliseconds(100));
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (!op.done() && absl::Now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(op.done());
  CHECK(op.ok());
  CHECK(op.thread() != std::this_thread::get_id());
}

TEST_CASE("a waiter takes over from the idle thread") {
  DrivenQueue queue(absl::Milliseconds(20));
  // Long enough for the idle thread to be driving, blocked in the queue
  // for up to a second at a time.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  AlarmOp op(&queue, absl::Milliseconds(100));
  REQUIRE(queue.WaitUntil(absl::Seconds(20), [&] { return op.done(); }));
  // The waiter drove: the idle thread gave way at once (an alarm woke it).
  CHECK(op.thread() == std::this_thread::get_id());
}

}  // namespace
}  // namespace asyncps
