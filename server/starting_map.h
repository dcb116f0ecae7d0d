#ifndef ASYNCPS_SERVER_STARTING_MAP_H_
#define ASYNCPS_SERVER_STARTING_MAP_H_

// The shard map a starting shard serves (common/shard_map.h). A run's map is
// chosen when it is created (ps_server --num_slots: 0 = the static map of
// --num_shards, S = S slots spread evenly; with --serving_shards=K, spread
// evenly over shards 0..K-1 only, the others standing by with no slot
// until psctl scale moves slots to them) and from then on travels with its
// files: a shard that restores files serves the map they were written under
// (its checkpoint's, else its spec file's), so a map that psctl reshard
// --map wrote (a rebalance) is what the restarted shards serve.
//
// Example (ps_server, before its store is built):
//
//   absl::StatusOr<ShardMap> map = StartingShardMap(
//       {dir, /*restore=*/true, shard_index, num_shards, num_slots, fs,
//        serving_shards});
//   if (!map.ok()) return map.status();  // files and flags disagree
//   options.store.map = *map;

#include <string>

#include "absl/status/statusor.h"
#include "common/shard_map.h"
#include "server/file_system.h"

namespace asyncps {

struct StartingMapInputs {
  std::string checkpoint_dir;  // "" = none
  bool restore = true;         // false: the files are not restored
  int shard_index = 0;
  int num_shards = 1;
  int num_slots = 0;         // --num_slots; 0 = the files' map, else static
  FileSystem* fs = nullptr;  // nullptr = FileSystem::Default()
  // --serving_shards: 0 = every shard owns slots; K = only shards 0..K-1
  // do (slot s on shard s mod K). REQUIRES a slotted run (num_slots > 0)
  // with 1 <= K <= num_shards and K <= num_slots.
  int serving_shards = 0;
};

// The files' map when the shard restores files that name one; the even map
// of num_slots over the serving shards (static when 0) otherwise, at
// ShardMap::kStaticEpoch, so that every shard started with the same flags
// serves the same map. A static run's files start a
// slotted run when num_shards divides num_slots (every key stays where it
// is). FAILED_PRECONDITION (saying which flag or which psctl command fixes
// it) when num_slots names another slot count than the files' map, or
// turns a static run's files into a map that would move keys;
// INVALID_ARGUMENT for a num_slots or serving_shards out of range; DATA_LOSS /
// I/O errors of reading the files.
absl::StatusOr<ShardMap> StartingShardMap(const StartingMapInputs& in);

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_STARTING_MAP_H_
