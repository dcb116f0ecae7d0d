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
  // The monotonic clock (CLOCK_MONOTONIC as an absl::Time after the Unix
  // epoch): never stepped, so only its differences mean anything. For what
  // must not move when an operator or NTP sets the real-time clock: how
  // long a lease is certainly held. Never null; lives for the whole
  // process.
  static Clock* Monotonic();
};

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_CLOCK_H_
