// A line that a loop repeats (common/log_limiter.h): the first is logged,
// the same text again within the interval is held back and counted, a new
// text or the interval's end lets one through with the count.
#include "common/log_limiter.h"

#include <catch2/catch.hpp>
#include <optional>

#include "absl/time/time.h"

namespace asyncps {
namespace {

const absl::Time t0 = absl::FromUnixSeconds(1000);

TEST_CASE("a repeated line is logged once per interval, with the count",
          "[logging]") {
  LogLimiter limiter(absl::Seconds(10));
  std::optional<uint64_t> held = limiter.Admit("etcd full", t0);
  REQUIRE(held.has_value());
  CHECK(*held == 0);
  for (int i = 1; i <= 5; ++i) {
    CHECK_FALSE(limiter.Admit("etcd full", t0 + absl::Seconds(i)).has_value());
  }
  held = limiter.Admit("etcd full", t0 + absl::Seconds(10));
  REQUIRE(held.has_value());
  CHECK(*held == 5);
  CHECK(LogLimiter::HeldBack(*held) ==
        " (5 more like it since the last one shown)");
  CHECK(LogLimiter::HeldBack(0).empty());
  // The count starts again from there.
  CHECK_FALSE(limiter.Admit("etcd full", t0 + absl::Seconds(11)).has_value());
  held = limiter.Admit("etcd full", t0 + absl::Seconds(25));
  REQUIRE(held.has_value());
  CHECK(*held == 1);
}

TEST_CASE("a line that says something new is logged at once", "[logging]") {
  LogLimiter limiter(absl::Seconds(10));
  REQUIRE(limiter.Admit("etcd full", t0).has_value());
  CHECK_FALSE(limiter.Admit("etcd full", t0 + absl::Seconds(1)).has_value());
  std::optional<uint64_t> held =
      limiter.Admit("etcd unreachable", t0 + absl::Seconds(2));
  REQUIRE(held.has_value());
  CHECK(*held == 0);  // the held-back lines said something else
  CHECK_FALSE(
      limiter.Admit("etcd unreachable", t0 + absl::Seconds(3)).has_value());
  // Back to the first text: new again.
  CHECK(limiter.Admit("etcd full", t0 + absl::Seconds(4)).has_value());
}

TEST_CASE("once the condition ended, its next line is logged at once",
          "[logging]") {
  LogLimiter limiter(absl::Seconds(10));
  REQUIRE(limiter.Admit("etcd full", t0).has_value());
  limiter.Reset();
  std::optional<uint64_t> held =
      limiter.Admit("etcd full", t0 + absl::Seconds(1));
  REQUIRE(held.has_value());
  CHECK(*held == 0);
}

}  // namespace
}  // namespace asyncps
