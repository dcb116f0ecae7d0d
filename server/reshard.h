#ifndef ASYNCPS_SERVER_RESHARD_H_
#define ASYNCPS_SERVER_RESHARD_H_

// Changing a model's shard count: rewrites the checkpoints (and spec files)
// of N shards into those of M shards (psctl reshard).
//
// Every old shard is restored into memory exactly as a restarting shard
// would restore it (its checkpoint, then its spec file: tensors created
// after the checkpoint get their initial values), then every dense slice
// and every table row moves, with its version and optimizer state, to its
// home among M shards (common/shard_map.h); the specs, the run id and the
// worker records (identities for fencing, clocks, data positions) are kept.
// The result is what M shards would hold had the model been trained on
// them: restored, they serve bit-identical parameters and optimizer state.
//
// Offline: the cluster must be stopped (every shard wrote its final
// checkpoint). Pushes the workers had in flight at that moment are settled:
// the merged de-duplication windows acknowledge every sequence number any
// old shard had seen, and workers restart anyway (new incarnations), since
// the shard addresses change. Memory: the new shards' state plus one old
// shard's at a time.

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/shard_map.h"
#include "server/file_system.h"

namespace asyncps {

struct ReshardReport {
  std::string run_id;
  int from_shards = 0;
  int to_shards = 0;
  int tensors = 0;
  int tables = 0;
  int64_t slices = 0;
  int64_t rows = 0;
  int workers = 0;
  std::vector<std::string> written;  // files, in shard order
};

struct ReshardOptions {
  std::string from_dir;  // the old shards' files
  std::string to_dir;    // the new shards' files; another directory
  int num_shards = 0;    // the new shard count, >= 1
  // Every file is read and written through it. Not owned; never null.
  FileSystem* fs = FileSystem::Default();
  // The new shards' map: `map` when set (its shard count must be
  // num_shards), else num_slots slots spread evenly when > 0, else the
  // static map. psctl rebalance writes maps to give here.
  std::optional<ShardMap> map;
  int num_slots = 0;
};

// Reads the shard files of `from_dir` (all of one shard count N, every
// shard 0..N-1 with a checkpoint or a spec file, all of one run) and writes
// checkpoints and spec files of `num_shards` shards to `to_dir` (created if
// missing; it must hold no shard files). FAILED_PRECONDITION naming what
// is missing or mixed, DATA_LOSS for a corrupt file (or one that reads back
// truncated), errors of listing a directory or reading a file (naming it),
// INVALID_ARGUMENT for bad arguments. Every old file is read before
// anything is written: a reshard that fails reading writes nothing (not even
// `to_dir`). A shard process running on either directory (its lock,
// server/checkpoint_lock.h, held) fails it with FAILED_PRECONDITION naming
// the process: reshard works on a stopped run's files.
absl::StatusOr<ReshardReport> Reshard(const ReshardOptions& options);

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_RESHARD_H_
