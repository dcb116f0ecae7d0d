#ifndef ASYNCPS_COMMON_CLOCK_H_
#define ASYNCPS_COMMON_CLOCK_H_

#include "absl/time/time.h"

namespace asyncps {

// Where time comes from, injected into everything that reads it (leases,
// waits, rates, checkpoint times, retries), so that tests can drive time by
// hand. Thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;

  // The real clock (absl::Now). Never null; lives for the whole process.
  static Clock* Real();
};

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_CLOCK_H_
