#ifndef ASYNCPS_TOOLS_LIVE_MOVES_H_
#define ASYNCPS_TOOLS_LIVE_MOVES_H_

// psctl's live slot moves: takes a running slotted run from the map its
// shards serve to a target map, one move (slots of one shard to another,
// one map epoch) at a time, while workers train (server/slot_mover.h
// does the moving). Shards behind the newest map adopt it first, and after
// each move the shards that took no part adopt the new map (AdoptMap), so
// that every shard answers with it.
//
//   psctl move --servers=... --slot_list=3,7,10-20 --to_shard=2
//   psctl rebalance --servers=... --apply [--threshold=1.05]
//   psctl adopt --servers=...

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/security.h"
#include "common/shard_map.h"
#include "tools/psctl_output.h"
#include "tools/status_table.h"

namespace asyncps {

// The map to plan from: the newest one the shards serve (a shard that took
// no part in a move may not have adopted it yet). UNAVAILABLE for a shard
// down that owns slots under it, FAILED_PRECONDITION for shards of different
// slot counts, and *code = kExitUsage for a static map (nothing moves).
absl::StatusOr<ShardMap> NewestMap(const std::vector<ShardResult>& results,
                                   int* code);

// Per shard of `results`, whether it owns no slot of the newest slotted map
// the shards that answered serve (psctl scale drained it, or it stands by):
// one that does not answer is then no fault of the run. All false without
// a slotted map.
std::vector<bool> OwningNoSlot(const std::vector<ShardResult>& results);

// "3,7,10-20" -> {3, 7, 10, ..., 20}; INVALID_ARGUMENT naming the bad part.
absl::StatusOr<std::vector<uint32_t>> ParseSlotList(const std::string& text);

struct LiveMoveOptions {
  std::vector<std::string> servers;  // in shard order
  SecurityOptions security;
  absl::Duration timeout;  // of each move
  Format format = Format::kTable;
  // psctl adopt --remake_lost: shards may take slots whose state is gone
  // (AdoptMapRequest.remake_lost).
  bool remake_lost = false;
};

// Moves the run from `current` to `target` (same slot and shard counts).
// Prints one line per move (or a document). Exit status: 0 every move
// committed, 1 one failed (the ones before it stand; the run serves the
// map of the last committed one), 2 bad usage.
int RunLiveMoves(const LiveMoveOptions& options, const ShardMap& current,
                 const ShardMap& target);

// psctl adopt: hands every shard `newest` (AdoptMap), e.g. to a shard
// restarted on files older than a move, which drops the slots the move
// took. Exit status: 0 every shard serves it, 1 otherwise.
int RunAdopt(const LiveMoveOptions& options, const ShardMap& newest);

}  // namespace asyncps

#endif  // ASYNCPS_TOOLS_LIVE_MOVES_H_
