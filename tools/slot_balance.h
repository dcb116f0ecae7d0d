#ifndef ASYNCPS_TOOLS_SLOT_BALANCE_H_
#define ASYNCPS_TOOLS_SLOT_BALANCE_H_

// Which slots of a slotted shard map to move so that no shard carries much
// more than the mean load (psctl rebalance). Greedy and deterministic: while
// the busiest shard carries more than `threshold` x the mean, one of its
// slots moves to the least busy shard, the one whose load is nearest half
// their difference (the move that lowers the larger of the two most); it
// stops when the busiest shard is within the threshold, when no slot of it
// can move without the destination ending up busier than it was, or after
// max_moves. A slot hotter than the mean cannot be helped by moving it:
// the plan reports it (hottest_slot).
//
// Example:
//
//   std::vector<uint64_t> load(map.num_slots());  // e.g. push bytes per slot
//   ...
//   absl::StatusOr<BalancePlan> plan = PlanBalance(map, load, 1.05, 4096);
//   if (!plan.ok()) return plan.status();  // a static map, a wrong length
//   WriteFile(ShardMapToText(plan->map));  // epoch map.epoch() + 1

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/shard_map.h"

namespace asyncps {

// Only the shards that own slots take part: a rebalance moves slots among
// them and never onto a shard that owns none (a standby, a drained shard,
// a group no process holds: changing the count is psctl scale's).
struct BalancePlan {
  ShardMap map;             // the new map, at the old epoch + 1
  std::vector<int> shards;  // the shards balanced: map.serving_shards()
  // Each of their loads under the old map, and under the new one.
  std::vector<uint64_t> before;
  std::vector<uint64_t> after;
  int moved_slots = 0;
  uint64_t hottest_slot_load = 0;
  uint32_t hottest_slot = 0;
};

// INVALID_ARGUMENT for a static map, a load of another length than the
// map's slots, a threshold below 1 or max_moves below 0.
absl::StatusOr<BalancePlan> PlanBalance(const ShardMap& map,
                                        absl::Span<const uint64_t> load,
                                        double threshold, int max_moves);

// The busiest shard's load over the mean (1 = even; 0 when nothing has
// load).
double Imbalance(absl::Span<const uint64_t> shard_loads);

}  // namespace asyncps

#endif  // ASYNCPS_TOOLS_SLOT_BALANCE_H_
