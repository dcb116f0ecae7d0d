#ifndef ASYNCPS_TESTS_TESTING_REAL_TIME_STEP_H_
#define ASYNCPS_TESTS_TESTING_REAL_TIME_STEP_H_

// Steps of the real-time clock inside one test process, as an operator's
// `date -s` or NTP makes them on a machine, without touching the machine's
// clock.
//
// A test binary that links this library reads CLOCK_REALTIME (through
// clock_gettime, so absl::Now, std::chrono::system_clock and gRPC's
// real-time clock) shifted by the sum of the steps so far; CLOCK_MONOTONIC
// and the kernel's own real-time clock are untouched. So, after
// StepRealTime(d):
// - times read before and after differ by d more than the time that passed,
//   as across a real step;
// - a wait whose deadline is a real-time instant computed afterwards (absl's
//   timed waits, in the abseil this project builds with, time themselves
//   so: a futex with an absolute FUTEX_CLOCK_REALTIME deadline, which the
//   kernel measures against its own clock) lasts d longer when d > 0: the
//   wait of a machine whose clock went back by d while it waited.
//
// Example:
//
//   testing::StepRealTime(absl::Seconds(30));   // absl::Now() jumps on
//   ... the code under test must not notice ...
//   testing::StepRealTime(absl::Seconds(-30));  // and back
//
// Thread-safe. Only for tests (it replaces clock_gettime in its process).

#include "absl/time/time.h"

namespace asyncps::testing {

// Adds `by` to the process's real-time clock from now on; returns once
// absl::Now() shows it (within 10 s).
void StepRealTime(absl::Duration by);

}  // namespace asyncps::testing

#endif  // ASYNCPS_TESTS_TESTING_REAL_TIME_STEP_H_
