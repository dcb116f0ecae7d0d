#include <catch2/catch.hpp>

#include "server/shard_stats.h"

namespace asyncps {
namespace {

SliceResult Result(SliceOutcome outcome, uint64_t staleness, float scale = 1) {
  SliceResult r;
  r.set_outcome(outcome);
  r.set_staleness(staleness);
  r.set_lr_scale(scale);
  return r;
}

TEST_CASE("staleness percentiles use the nearest rank", "[stats]") {
  ShardStats stats;
  for (int i = 0; i < 4; ++i) stats.RecordSliceResult(Result(APPLIED, 0));
  stats.RecordSliceResult(Result(APPLIED, 1));
  Counters c;
  StalenessHistogram h;
  Rates r;
  stats.Snapshot(&c, &h, &r);
  REQUIRE(h.p50() == 0);
  REQUIRE(h.p90() == 1);  // rank ceil(4.5) = 5
  REQUIRE(h.p99() == 1);
  REQUIRE(h.max() == 1);
  REQUIRE(h.sum() == 1);
  REQUIRE(h.mean() == Approx(0.2));
}

TEST_CASE("large staleness lands in power-of-two buckets", "[stats]") {
  ShardStats stats;
  stats.RecordSliceResult(Result(REFUSED_STALE, 40));
  stats.RecordSliceResult(Result(APPLIED, 3, 0.25f));
  stats.RecordSliceResult(Result(APPLIED, 1u << 20));
  Counters c;
  StalenessHistogram h;
  Rates r;
  stats.Snapshot(&c, &h, &r);
  REQUIRE(c.updates_applied() == 2);
  REQUIRE(c.refused_stale() == 1);
  REQUIRE(c.scaled() == 1);
  REQUIRE(h.counts(ShardStats::BucketOf(3)) == 1);
  REQUIRE(ShardStats::BucketUpperBound(ShardStats::BucketOf(40)) == 64);
  REQUIRE(h.counts(ShardStats::BucketOf(40)) == 1);
  REQUIRE(ShardStats::BucketOf(1u << 20) == ShardStats::kBuckets - 1);
  REQUIRE(h.p50() == 32);  // lower edge of [32, 64)
  REQUIRE(h.max() == (1u << 20));
  uint64_t total = 0;
  for (uint64_t n : h.counts()) total += n;
  REQUIRE(total == 3);
}

}  // namespace
}  // namespace asyncps
