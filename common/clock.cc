#include "common/clock.h"

#include <chrono>

#include "absl/time/clock.h"

namespace asyncps {
namespace {

class RealClock : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

class MonotonicClock : public Clock {
 public:
  absl::Time Now() const override {
    return absl::UnixEpoch() +
           absl::FromChrono(
               std::chrono::steady_clock::now().time_since_epoch());
  }
};

}  // namespace

Clock* Clock::Monotonic() {
  static MonotonicClock* const clock = new MonotonicClock();
  return clock;
}

Clock* Clock::Real() {
  static RealClock* const clock = new RealClock();
  return clock;
}

}  // namespace asyncps
