#include "common/steady_wait.h"

#include <chrono>

namespace asyncps {

namespace {

// absl::Mutex as a BasicLockable for std::condition_variable_any, which
// releases it while it waits and takes it again before returning.
class Unlockable {
 public:
  explicit Unlockable(absl::Mutex* mu) : mu_(mu) {}
  void lock() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_->Lock(); }
  void unlock() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_->Unlock(); }

 private:
  absl::Mutex* const mu_;
};

}  // namespace

bool AwaitSteadily(absl::Mutex* mu, std::condition_variable_any* cv,
                   absl::Duration timeout, absl::FunctionRef<bool()> done) {
  Unlockable lock(mu);
  if (timeout == absl::InfiniteDuration()) {
    cv->wait(lock, [&] { return done(); });
    return true;
  }
  if (timeout < absl::ZeroDuration()) timeout = absl::ZeroDuration();
  return cv->wait_for(lock, absl::ToChronoNanoseconds(timeout),
                      [&] { return done(); });
}

void SteadyNotification::Notify() {
  absl::MutexLock l(&mu_);
  notified_ = true;
  // Under mu_: a waiter that sees notified_ may destroy this at once.
  cv_.notify_all();
}

bool SteadyNotification::HasBeenNotified() const {
  absl::MutexLock l(&mu_);
  return notified_;
}

bool SteadyNotification::WaitForNotificationWithTimeout(
    absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  return AwaitSteadily(
      &mu_, &cv_, timeout,
      [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return notified_; });
}

}  // namespace asyncps
