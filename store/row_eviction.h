#ifndef ASYNCPS_STORE_ROW_EVICTION_H_
#define ASYNCPS_STORE_ROW_EVICTION_H_

// How the rows of a sparse table are ranked when the shard's memory cap
// (--max_parameter_bytes) needs room (TableSpec.eviction): EVICT_LRU by the
// worker clock of a row's last use, EVICT_LFU by a use count that halves
// every lfu_half_life_steps steps. A lower score goes first. EVICT_TTL
// tables are not evicted under the cap (only by --row_ttl_steps).
//
// Example:
//
//   const EvictionRule rule(spec);  // EVICT_LFU
//   float uses = 0;
//   uses = rule.CountAfterUse(uses, /*last=*/0, /*clock=*/0);    // 1
//   uses = rule.CountAfterUse(uses, /*last=*/0, /*clock=*/1000);  // 1.5
//   const double score = rule.Score(/*touched=*/1000, uses, /*now=*/2000);
//   // 0.75 with the default half-life of 1000 steps.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

class EvictionRule {
 public:
  static constexpr uint32_t kDefaultHalfLife = 1000;
  // Rows an evicting table must have room for when it is created.
  static constexpr uint64_t kMinRows = 1024;

  // INVALID_ARGUMENT naming the table: an unknown policy, or
  // lfu_half_life_steps set without EVICT_LFU.
  static absl::Status Validate(const TableSpec& spec);

  // REQUIRES: Validate(spec).ok().
  explicit EvictionRule(const TableSpec& spec);

  // Whether the table gives up rows under the cap.
  bool under_cap() const { return policy_ != EVICT_TTL; }
  // Whether rows keep a use count (EVICT_LFU).
  bool counts_uses() const { return policy_ == EVICT_LFU; }

  // A row's use count after a use at `clock`, its last use having been at
  // `last` with count `count`.
  float CountAfterUse(float count, int64_t last, int64_t clock) const;
  // The row's rank at clock `now` (lower goes first).
  double Score(int64_t touched, float count, int64_t now) const;

 private:
  const EvictionPolicy policy_;
  const double half_life_;
};

// The score at or below which about `fraction` of the rows lie, from a
// sample of their scores (reordered). REQUIRES: !samples->empty().
double ScoreQuantile(std::vector<double>* samples, double fraction);

}  // namespace asyncps

#endif  // ASYNCPS_STORE_ROW_EVICTION_H_
