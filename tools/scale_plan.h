#ifndef ASYNCPS_TOOLS_SCALE_PLAN_H_
#define ASYNCPS_TOOLS_SCALE_PLAN_H_

// The map of psctl scale: a slotted run's slots spread over its first M
// shard processes, so that shards M and above own no slot (and may be
// stopped) and shards below M own as even a share as the slot count
// allows, moving as few slots as that needs: a shard below M keeps its own
// slots up to its share; the slots of the shards from M on and the surplus
// of the others go to the shards below their share, each source filling
// one destination before the next, so that the change is few (source,
// destination) moves (tools/live_moves.h runs one per pair).
//
// Example:
//
//   // 3 -> 4: a quarter of the slots, taken evenly from shards 0-2, go to
//   // shard 3; 4 -> 2: shard 2's slots go to shard 0, shard 3's to 1.
//   absl::StatusOr<ShardMap> target = PlanScale(current, 4);
//   if (!target.ok()) return target.status();  // e.g. a static map
//   RunLiveMoves(options, current, *target);

#include "absl/status/statusor.h"
#include "common/shard_map.h"

namespace asyncps {

// The target map at current.epoch() + 1 (the moves that reach it advance
// the epoch pair by pair). INVALID_ARGUMENT for a static map, for `shards`
// below 1 or above the run's shard processes (current.num_shards()), or
// above the slot count.
absl::StatusOr<ShardMap> PlanScale(const ShardMap& current, int shards);

}  // namespace asyncps

#endif  // ASYNCPS_TOOLS_SCALE_PLAN_H_
