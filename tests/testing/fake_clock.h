#ifndef ASYNCPS_TESTS_TESTING_FAKE_CLOCK_H_
#define ASYNCPS_TESTS_TESTING_FAKE_CLOCK_H_

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace asyncps {
namespace testing {

// A clock the test moves by hand. Thread-safe.
class FakeClock : public Clock {
 public:
  absl::Time Now() const override {
    absl::MutexLock l(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock l(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::FromUnixSeconds(1000000);
};

}  // namespace testing
}  // namespace asyncps

#endif  // ASYNCPS_TESTS_TESTING_FAKE_CLOCK_H_
