// Waits timed on the monotonic clock (common/steady_wait.h) and the
// monotonic clock itself (common/clock.h): timeouts are honoured, a
// notification or a condition made true ends a wait at once. (What a step
// of the real-time clock does to them: tests/faults/clock_step_test.cc and
// tests/cluster/clock_step.py.)
#include "common/steady_wait.h"

#include <catch2/catch.hpp>
#include <thread>

#include "absl/time/clock.h"
#include "common/clock.h"

namespace asyncps {
namespace {

// How long `wait` took, on the monotonic clock.
template <typename Wait>
absl::Duration Took(Wait wait) {
  const absl::Time start = Clock::Monotonic()->Now();
  wait();
  return Clock::Monotonic()->Now() - start;
}

TEST_CASE("the monotonic clock moves on with time", "[clock]") {
  const absl::Duration slept =
      Took([] { absl::SleepFor(absl::Milliseconds(50)); });
  CHECK(slept >= absl::Milliseconds(50));
  CHECK(slept < absl::Seconds(5));
}

TEST_CASE("a steady notification times out, or ends its wait when notified",
          "[clock]") {
  SteadyNotification n;
  CHECK_FALSE(n.HasBeenNotified());
  bool notified = true;
  const absl::Duration timed_out = Took([&] {
    notified = n.WaitForNotificationWithTimeout(absl::Milliseconds(100));
  });
  CHECK_FALSE(notified);
  CHECK(timed_out >= absl::Milliseconds(100));
  CHECK(timed_out < absl::Seconds(5));

  std::thread notifier([&] {
    absl::SleepFor(absl::Milliseconds(50));
    n.Notify();
  });
  const absl::Duration woken = Took(
      [&] { notified = n.WaitForNotificationWithTimeout(absl::Seconds(30)); });
  notifier.join();
  CHECK(notified);
  CHECK(woken < absl::Seconds(5));
  CHECK(n.HasBeenNotified());
  CHECK(Took([&] {
          CHECK(n.WaitForNotificationWithTimeout(absl::Seconds(30)));
        }) < absl::Seconds(1));
}

TEST_CASE("AwaitSteadily returns the condition: made true, or at the timeout",
          "[clock]") {
  absl::Mutex mu;
  std::condition_variable_any cv;
  bool done = false;
  const auto is_done = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return done; };
  // Sets done after 50 ms, under the lock, which the waiter released.
  const auto set_soon = [&] {
    return std::thread([&] {
      absl::SleepFor(absl::Milliseconds(50));
      {
        absl::MutexLock l(&mu);
        done = true;
      }
      cv.notify_all();
    });
  };
  {
    absl::MutexLock l(&mu);
    CHECK_FALSE(AwaitSteadily(&mu, &cv, absl::Milliseconds(-5), is_done));
    const absl::Duration timed_out = Took([&] {
      CHECK_FALSE(AwaitSteadily(&mu, &cv, absl::Milliseconds(100), is_done));
    });
    CHECK(timed_out >= absl::Milliseconds(100));
    CHECK(timed_out < absl::Seconds(5));
  }
  std::thread setter = set_soon();
  {
    absl::MutexLock l(&mu);
    const absl::Duration woken = Took(
        [&] { CHECK(AwaitSteadily(&mu, &cv, absl::Seconds(30), is_done)); });
    CHECK(woken < absl::Seconds(5));
    done = false;
  }
  setter.join();
  setter = set_soon();
  {
    absl::MutexLock l(&mu);
    CHECK(AwaitSteadily(&mu, &cv, absl::InfiniteDuration(), is_done));
  }
  setter.join();
}

}  // namespace
}  // namespace asyncps
