#ifndef ASYNCPS_COMMON_STEADY_WAIT_H_
#define ASYNCPS_COMMON_STEADY_WAIT_H_

// Waits timed on the monotonic clock, for the waits that a step of the
// real-time clock must not stretch.
//
// absl's timed waits (Mutex::AwaitWithTimeout, CondVar::WaitWithTimeout,
// Notification::WaitForNotificationWithTimeout), in the abseil this
// project builds with, turn a timeout into a deadline on the real-time
// clock: a wait in progress when an operator or NTP steps that clock back
// by 20 s ends 20 s late. For most waits that costs one late wake-up; for
// a lease it is a lease lost in etcd while its holder sleeps and believes
// it held (tests/cluster/clock_step.py measures it). These wait on
// std::condition_variable_any, which libstdc++ times on CLOCK_MONOTONIC.
//
// Example (a reactor's answer, or 2 s):
//
//   absl::MutexLock l(&mu_);
//   const bool answered = AwaitSteadily(&mu_, &cv_, absl::Seconds(2), [&] {
//     return answer_.has_value();
//   });
//   ...
//   // The callback that sets answer_ calls cv_.notify_all() before it
//   // releases mu_.

#include <condition_variable>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace asyncps {

// Waits, with `mu` held (released meanwhile), until `done()` or until
// `timeout` passed on the monotonic clock; returns done(). Whoever makes
// done() true does so under `mu` and calls cv->notify_all() before it
// releases `mu`: a waiter that sees done() (it may have timed out just
// then) may destroy `cv` at once, and a notify after that touches freed
// memory. An infinite timeout waits for done() alone.
bool AwaitSteadily(absl::Mutex* mu, std::condition_variable_any* cv,
                   absl::Duration timeout, absl::FunctionRef<bool()> done)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu);

// absl::Notification with its timed wait on the monotonic clock.
// Thread-safe.
class SteadyNotification {
 public:
  SteadyNotification() = default;
  SteadyNotification(const SteadyNotification&) = delete;
  SteadyNotification& operator=(const SteadyNotification&) = delete;

  void Notify();
  bool HasBeenNotified() const;
  // True once notified (at once when it was); false after `timeout`.
  bool WaitForNotificationWithTimeout(absl::Duration timeout);

 private:
  mutable absl::Mutex mu_;
  std::condition_variable_any cv_;
  bool notified_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_STEADY_WAIT_H_
