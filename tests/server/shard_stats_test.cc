#include "server/shard_stats.h"

#include <catch2/catch.hpp>

namespace asyncps {
namespace {

SliceResult Result(SliceOutcome outcome, uint64_t staleness, float scale = 1) {
  SliceResult r;
  r.set_outcome(outcome);
  r.set_staleness(staleness);
  r.set_lr_scale(scale);
  return r;
}

PushResponse Push(std::vector<SliceResult> results) {
  PushResponse p;
  for (SliceResult& r : results) *p.add_results() = std::move(r);
  return p;
}

TEST_CASE("staleness percentiles use the nearest rank", "[stats]") {
  ShardStats stats;
  stats.RecordPush(100, false,
                   Push({Result(APPLIED, 0), Result(APPLIED, 0),
                         Result(APPLIED, 0), Result(APPLIED, 0)}));
  stats.RecordPush(25, false, Push({Result(APPLIED, 1)}));
  Counters c;
  StalenessHistogram h;
  Rates r;
  stats.Snapshot(&c, &h, &r);
  REQUIRE(c.pushes() == 2);
  REQUIRE(c.bytes_in() == 125);
  REQUIRE(h.p50() == 0);
  REQUIRE(h.p90() == 1);  // rank ceil(4.5) = 5
  REQUIRE(h.p99() == 1);
  REQUIRE(h.max() == 1);
  REQUIRE(h.sum() == 1);
  REQUIRE(h.mean() == Approx(0.2));
}

TEST_CASE("large staleness lands in power-of-two buckets", "[stats]") {
  ShardStats stats;
  stats.RecordPush(
      0, false,
      Push({Result(REFUSED_STALE, 40), Result(APPLIED, 3, 0.25f),
            Result(APPLIED, 1u << 20), Result(REFUSED_RESTORED, 0)}));
  Counters c;
  StalenessHistogram h;
  Rates r;
  stats.Snapshot(&c, &h, &r);
  REQUIRE(c.updates_applied() == 2);
  REQUIRE(c.refused_stale() == 1);
  REQUIRE(c.refused_restored() == 1);
  REQUIRE(c.scaled() == 1);
  REQUIRE(h.counts(ShardStats::BucketOf(3)) == 1);
  REQUIRE(ShardStats::BucketUpperBound(ShardStats::BucketOf(40)) == 64);
  REQUIRE(h.counts(ShardStats::BucketOf(40)) == 1);
  REQUIRE(ShardStats::BucketOf(1u << 20) == ShardStats::kBuckets - 1);
  REQUIRE(h.p50() == 32);  // lower edge of [32, 64)
  REQUIRE(h.max() == (1u << 20));
  uint64_t total = 0;
  for (uint64_t n : h.counts()) total += n;
  REQUIRE(total == 3);  // refused-restored slices have no staleness
}

TEST_CASE("a duplicate push counts, but none of its slices", "[stats]") {
  ShardStats stats;
  stats.RecordPush(64, true, PushResponse());
  Counters c;
  StalenessHistogram h;
  Rates r;
  stats.Snapshot(&c, &h, &r);
  REQUIRE(c.pushes() == 1);
  REQUIRE(c.duplicate_pushes() == 1);
  REQUIRE(c.updates_applied() == 0);
}

TEST_CASE("rates come from fixed samples, whoever reads them", "[stats]") {
  ShardStats stats;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  stats.Sample(t0);
  for (int i = 0; i < 20; ++i) stats.RecordPush(1000, false, PushResponse());
  stats.Sample(t0 + absl::Seconds(10));
  Counters c;
  StalenessHistogram h;
  Rates first, second;
  stats.Snapshot(&c, &h, &first);
  // Another reader right after sees the same window and rates.
  stats.RecordPush(1000, false, PushResponse());
  stats.Snapshot(&c, &h, &second);
  REQUIRE(first.interval_s() == Approx(10));
  REQUIRE(first.pushes_per_s() == Approx(2.0));
  REQUIRE(first.bytes_in_per_s() == Approx(2000.0));
  REQUIRE(second.pushes_per_s() == first.pushes_per_s());
  // Older samples drop out once the window spans 10 s without them.
  stats.Sample(t0 + absl::Seconds(15));
  stats.Sample(t0 + absl::Seconds(20));
  Rates third;
  stats.Snapshot(&c, &h, &third);
  REQUIRE(third.interval_s() == Approx(10));
  REQUIRE(third.pushes_per_s() == Approx(0.1));
}

}  // namespace
}  // namespace asyncps
