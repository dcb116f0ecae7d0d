#ifndef ASYNCPS_SERVER_SHARD_SET_H_
#define ASYNCPS_SERVER_SHARD_SET_H_

// A checkpoint directory's shard files as one set, restored offline (psctl
// reshard, ps_serve --checkpoint_dir): every shard in memory exactly as a
// restarting shard would restore it (its checkpoint, then its spec file:
// tensors created after the checkpoint get their initial values).

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/checkpoint.pb.h"
#include "server/file_system.h"
#include "store/shard_store.h"

namespace asyncps {

// The files of N shards: checkpoints[i] and spec_files[i] are shard i's
// ("" where it has none; every shard has at least one of them).
struct ShardFileSet {
  std::string dir;
  int num_shards = 0;
  std::vector<std::string> checkpoints;
  std::vector<std::string> spec_files;
  // Per shard, the deltas of its checkpoint's chain in sequence order
  // (server/checkpoint_delta.h), applied after it.
  std::vector<std::vector<std::string>> deltas;
};

// The shard files of `dir`, listed through `fs` (nullptr =
// FileSystem::Default()): FAILED_PRECONDITION when it holds none, mixes
// shard counts, or lacks every file of some shard; errors of listing it.
absl::StatusOr<ShardFileSet> FindShardFileSet(const std::string& dir,
                                              FileSystem* fs = nullptr);

// Every file of `set` (checkpoints, spec files and deltas).
std::vector<std::string> AllFiles(const ShardFileSet& set);

// One shard of a set, restored.
struct RestoredShard {
  std::unique_ptr<ShardStore> store;
  std::vector<CheckpointWorker> workers;  // from its checkpoint
  std::string run_id;
};

// Restores shard `index` of `set` into a new store, reading through `fs`
// (nullptr = FileSystem::Default()). Errors of RestoreCheckpoint and of
// reading the spec file (naming the file); deltas as RestoreCheckpoint
// applies them (a torn one is ignored with the ones after it);
// FAILED_PRECONDITION when its checkpoint and spec file belong to different
// runs. On error no store is returned: nothing half-restored escapes.
absl::StatusOr<RestoredShard> RestoreShard(const ShardFileSet& set, int index,
                                           FileSystem* fs = nullptr);

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_SHARD_SET_H_
