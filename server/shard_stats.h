#ifndef ASYNCPS_SERVER_SHARD_STATS_H_
#define ASYNCPS_SERVER_SHARD_STATS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

// Counters and the staleness histogram of one shard. A push or pull records
// once, with totals it added up itself, so the hot path costs a few relaxed
// atomic adds per call (not per slice) and never a lock. Snapshot()
// assembles the proto for the Status RPC.
//
// Rates are computed from samples taken at fixed times (Sample(), once per
// second by the shard): every reader sees the same rates for the same
// window, whoever else reads them (psctl --watch and a Prometheus scrape do
// not disturb each other).
//
// Thread-safe.
class ShardStats {
 public:
  // Staleness buckets: one per value 0..15, then powers of two up to 2^16,
  // then everything larger.
  static constexpr int kExactBuckets = 16;
  static constexpr int kBuckets = kExactBuckets + 13;
  // Rates are over the newest sample and the one this long before it.
  static constexpr absl::Duration kRateWindow = absl::Seconds(10);

  ShardStats();

  void RecordPull(uint64_t bytes_out);
  // A pull that had to wait for slower workers.
  void RecordPullWait();
  void RecordPullWaitTimeout();
  // A push that was applied (or refused per slice) with these results, or
  // acknowledged as a duplicate.
  void RecordPush(uint64_t bytes_in, bool duplicate,
                  const PushResponse& response);
  void RecordBadInput();
  // A push that came with the next step's pull (StepStream).
  void RecordStep();
  // A pull or push refused for the map it was routed with, or for a fence
  // (the slow path of CheckServing).
  void RecordMisrouted();
  // Pulls, pushes (duplicates too) and misrouted calls so far: whether
  // clients still call this shard.
  uint64_t DataCalls() const;

  // Records the counters as of `now` for the rates. Called once per second.
  void Sample(absl::Time now);

  // Fills counters, the histogram and the rates of the last complete window.
  void Snapshot(Counters* counters, StalenessHistogram* histogram,
                Rates* rates) const;

  // Upper bound (exclusive) of histogram bucket i; the last is INT64_MAX.
  static uint64_t BucketUpperBound(int i);
  static int BucketOf(uint64_t staleness);

 private:
  void FillCounters(Counters* c) const;

  std::atomic<uint64_t> pulls_{0}, pushes_{0}, duplicate_pushes_{0},
      updates_applied_{0}, refused_stale_{0}, refused_restored_{0}, scaled_{0},
      rejected_bad_input_{0}, bytes_in_{0}, bytes_out_{0}, pull_waits_{0},
      pull_wait_timeouts_{0}, misrouted_{0}, steps_{0};
  std::array<std::atomic<uint64_t>, kBuckets> buckets_;
  std::atomic<uint64_t> staleness_sum_{0}, staleness_count_{0},
      staleness_max_{0};

  struct RateSample {
    absl::Time time;
    Counters counters;
  };
  mutable absl::Mutex mu_;
  // Samples of the last kRateWindow (plus one), oldest first.
  std::deque<RateSample> samples_ ABSL_GUARDED_BY(mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_SHARD_STATS_H_
