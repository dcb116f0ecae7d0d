#ifndef ASYNCPS_SERVER_SHARD_STATS_H_
#define ASYNCPS_SERVER_SHARD_STATS_H_

#include <array>
#include <atomic>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

// Counters and the staleness histogram of one shard. Recording is a few
// relaxed atomic adds, so the hot path never contends on a lock; Snapshot()
// assembles the proto for the Status RPC.
//
// Thread-safe.
class ShardStats {
 public:
  // Staleness buckets: one per value 0..15, then powers of two up to 2^16,
  // then everything larger.
  static constexpr int kExactBuckets = 16;
  static constexpr int kBuckets = kExactBuckets + 13;

  ShardStats();

  void RecordPull(uint64_t bytes_out);
  // A pull that had to wait for slower workers.
  void RecordPullWait();
  void RecordPullWaitTimeout();
  void RecordPush(uint64_t bytes_in, bool duplicate);
  void RecordBadInput();
  // One slice update from a push, applied or refused.
  void RecordSliceResult(const SliceResult& result);

  // Fills counters, the histogram and the rates since the previous call that
  // was at least `min_interval` ago.
  void Snapshot(Counters* counters, StalenessHistogram* histogram,
                Rates* rates, absl::Duration min_interval = absl::Seconds(1));

  // Upper bound (exclusive) of histogram bucket i; the last is INT64_MAX.
  static uint64_t BucketUpperBound(int i);
  static int BucketOf(uint64_t staleness);

 private:
  std::atomic<uint64_t> pulls_{0}, pushes_{0}, duplicate_pushes_{0},
      updates_applied_{0}, refused_stale_{0}, scaled_{0},
      rejected_bad_input_{0}, bytes_in_{0}, bytes_out_{0}, pull_waits_{0},
      pull_wait_timeouts_{0};
  std::array<std::atomic<uint64_t>, kBuckets> buckets_;
  std::atomic<uint64_t> staleness_sum_{0}, staleness_count_{0},
      staleness_max_{0};

  absl::Mutex mu_;  // guards the previous snapshot used for rates
  absl::Time last_time_ ABSL_GUARDED_BY(mu_);
  Counters last_ ABSL_GUARDED_BY(mu_);
  Rates last_rates_ ABSL_GUARDED_BY(mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_SHARD_STATS_H_
