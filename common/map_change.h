#ifndef ASYNCPS_COMMON_MAP_CHANGE_H_
#define ASYNCPS_COMMON_MAP_CHANGE_H_

// One step of a slotted run's map (common/shard_map.h) while it trains:
// some slots of one shard go to another, under the next epoch. psctl plans
// steps with WithSlotsMoved; the two shards of a move check with
// SlotsMoving that the step they are asked to make is one.
//
// Example:
//
//   absl::StatusOr<ShardMap> next = WithSlotsMoved(current, {7, 9}, 2);
//   // next->epoch() == current.epoch() + 1; slots 7 and 9 on shard 2
//   absl::StatusOr<std::vector<uint32_t>> slots =
//       SlotsMoving(current, *next, /*from=*/0, /*to=*/2);

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/shard_map.h"

namespace asyncps {

// `current` one epoch on, with `slots` owned by shard `to`.
// INVALID_ARGUMENT unless current is slotted, every slot is below its slot
// count and `to` below its shard count.
absl::StatusOr<ShardMap> WithSlotsMoved(const ShardMap& current,
                                        absl::Span<const uint32_t> slots,
                                        int to);

// The slots that `next` moves from shard `from` to shard `to` (ascending).
// FAILED_PRECONDITION (saying which) unless both maps are slotted with the
// same slot and shard counts, next's epoch is current's + 1, from != to,
// at least one slot moves, and every slot that changes owner goes from
// `from` to `to`.
absl::StatusOr<std::vector<uint32_t>> SlotsMoving(const ShardMap& current,
                                                  const ShardMap& next,
                                                  int from, int to);

// OK when shard `shard`, serving `current`, may serve `next` without a
// move: a slotted map of the same shard and slot counts, at a newer epoch
// (or `current` itself), that gives `shard` no slot it does not own now.
// It may take slots away: those a move committed while this shard ran on
// older files (a source restarted from a checkpoint taken before the move:
// the destination holds them). INVALID_ARGUMENT for a map that is not one
// of this run (another shard or slot count, a static map),
// FAILED_PRECONDITION (naming the epochs or the first slot gained)
// otherwise. With `may_gain`, slots gained are no reason to refuse (a map
// read from the run's record, whose moves into this shard its state lost).
absl::Status CheckAdoptable(const ShardMap& current, const ShardMap& next,
                            int shard, bool may_gain = false);

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_MAP_CHANGE_H_
