#include "tests/testing/real_time_step.h"

#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>

#include "absl/time/clock.h"

namespace asyncps::testing {
namespace {

std::atomic<int64_t> offset_ns{0};

}  // namespace

void StepRealTime(absl::Duration by) {
  const absl::Time wall = absl::Now();
  const auto mono = std::chrono::steady_clock::now();
  offset_ns.fetch_add(absl::ToInt64Nanoseconds(by));
  // absl::Now() goes on from its last reading of the clock for a while
  // (its cycle-counter estimate): wait until it shows the step too.
  for (int i = 0; i < 1000; ++i) {
    const absl::Time expected =
        wall + by + absl::FromChrono(std::chrono::steady_clock::now() - mono);
    if (absl::AbsDuration(absl::Now() - expected) < absl::Milliseconds(200)) {
      return;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

}  // namespace asyncps::testing

// The process's clock_gettime: the kernel's, real time shifted. Shared
// libraries (abseil, gRPC, libstdc++) call it through their PLT, so they
// see the shift too.
extern "C" int clock_gettime(clockid_t id, struct timespec* ts) {
  if (syscall(SYS_clock_gettime, id, ts) != 0) return -1;
  if (id != CLOCK_REALTIME && id != CLOCK_REALTIME_COARSE) return 0;
  const int64_t ns =
      static_cast<int64_t>(ts->tv_sec) * 1000000000 + ts->tv_nsec +
      asyncps::testing::offset_ns.load(std::memory_order_relaxed);
  ts->tv_sec = ns / 1000000000;
  ts->tv_nsec = ns % 1000000000;
  return 0;
}
