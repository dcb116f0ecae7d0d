#ifndef ASYNCPS_TOOLS_MAP_COMMANDS_H_
#define ASYNCPS_TOOLS_MAP_COMMANDS_H_

// The psctl commands that change where keys live.
//
// `psctl rebalance` asks every shard of a running slotted run for its
// per-slot load (StatusRequest.slot_load), plans which slots to move so
// that no shard carries more than --threshold x the mean
// (tools/slot_balance.h), prints each shard's load before and after, and
// writes the new map to --out. `psctl reshard` rewrites a stopped run's
// files into those of another map: another shard count (--shards), slots
// (--slots, spread evenly), or a map file (--map, e.g. the one rebalance
// wrote), with bit-identical parameters and optimizer state.
//
//   psctl rebalance --servers=... --out=map.txt [--threshold=1.05]
//                   [--by=bytes|updates|rows] [--apply]
//   psctl move --servers=... --slot_list=3,7,10-20 --to_shard=2
//   psctl reshard --from=DIR --to=NEW --shards=4 --map=map.txt

#include <string>

#include "absl/time/time.h"
#include "tools/live_moves.h"
#include "tools/psctl_output.h"
#include "tools/shard_query.h"

namespace asyncps {

struct ReshardFlags {
  std::string from;
  std::string to;
  int shards = 0;
  int slots = 0;         // > 0: the even map of this many slots
  std::string map_file;  // a map file (ShardMapToText); overrides slots
};

// Exit status: 0 written, 1 failed (the reason on stderr), 2 bad usage.
int RunReshard(const ReshardFlags& flags, Format format);

struct RebalanceFlags {
  std::string out;     // where the new map goes (optional with apply)
  bool apply = false;  // move the slots there now (tools/live_moves.h)
  double threshold = 1.05;
  std::string by = "bytes";  // bytes, updates or rows
  int max_moves = 4096;
};

// Exit status: 0 the plan was written (and applied), 1 a shard did not
// answer, the shards serve maps of different slot counts or a move failed,
// 2 bad usage (a static map among them).
int RunRebalance(ShardQuery* query, absl::Duration timeout,
                 const RebalanceFlags& flags, const LiveMoveOptions& live);

// psctl rebalance --apply --watch=D: the automatic mode. Every D, plans
// from the load of the last D (the per-slot counters' growth since the
// previous reading, so that a hot spot that moved on is not chased) and
// moves the slots when the busiest shard is beyond the threshold; until
// SIGINT or SIGTERM (main blocks them first: common/net.h BlockStopSignals). A
// failed round is reported and the next one tries again. Exit status: 0 when
// stopped by a signal, 2 bad usage.
int RunRebalanceEvery(ShardQuery* query, absl::Duration timeout,
                      const RebalanceFlags& flags, const LiveMoveOptions& live,
                      absl::Duration every);

// psctl adopt: every shard to the newest map the shards serve.
int RunAdoptNewest(ShardQuery* query, absl::Duration timeout,
                   const LiveMoveOptions& live);

// psctl move: `slot_list` (ParseSlotList) to shard `to_shard`, live.
int RunMove(ShardQuery* query, absl::Duration timeout,
            const std::string& slot_list, int to_shard,
            const LiveMoveOptions& live);

// psctl scale: the slots over the first `shards` shard processes
// (tools/scale_plan.h), live; the shards from `shards` on then own no slot
// and may be stopped. Every shard below `shards` must answer (start a
// stopped one first). Exit status: 0 the run serves the new map, 1 a shard
// did not answer or a move failed (the moves before it stand), 2 bad usage
// (a static map, --shards out of range).
int RunScale(ShardQuery* query, absl::Duration timeout, int shards,
             const LiveMoveOptions& live);

// psctl scale --watch=D (no --shards): the run grows by itself onto the
// shard processes that come up. Every D, the longest run of shards from 0
// that answer and are not drained (StatusResponse.drained: their slots
// were moved away by a scale down) is taken as the wanted count, and the
// slots are spread over it when it is larger than the shards serving now.
// It never shrinks the run: a shard that stops answering may have crashed
// with its slots; a scale down is `psctl scale --shards=M` (on Kubernetes
// the preStop hook of the pod that goes, deploy/k8s/elastic). Until SIGINT
// or SIGTERM (exit 0); a failed round is reported and tried again.
int RunScaleFollow(ShardQuery* query, absl::Duration timeout,
                   const LiveMoveOptions& live, absl::Duration every);

}  // namespace asyncps

#endif  // ASYNCPS_TOOLS_MAP_COMMANDS_H_
