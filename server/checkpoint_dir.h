#ifndef ASYNCPS_SERVER_CHECKPOINT_DIR_H_
#define ASYNCPS_SERVER_CHECKPOINT_DIR_H_

// Which files of a checkpoint directory a shard may use, decided before it
// reads any of them: a shard restores only its own run's state, of its own
// shard count.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/file_system.h"

namespace asyncps {

// One shard file of a checkpoint directory: shard-<i>-of-<n>.ckpt (a
// checkpoint), .specs (a spec file) or .delta-<k> (delta k of the
// checkpoint's chain, server/checkpoint_delta.h).
struct ShardFile {
  std::string path;
  int shard_index = 0;
  int num_shards = 0;
  bool spec_file = false;       // .specs rather than .ckpt
  uint64_t delta_sequence = 0;  // > 0: a delta rather than a checkpoint
};

// The shard files in `dir`, listed through `fs` (nullptr =
// FileSystem::Default()), sorted by name (leftover .tmp files and other
// names are not listed). An absent directory holds none; any other error of
// listing it (naming it) is returned.
absl::StatusOr<std::vector<ShardFile>> ListShardFiles(const std::string& dir,
                                                      FileSystem* fs = nullptr);

// The deltas of shard `shard_index` of `num_shards` among `files`, in
// sequence order.
std::vector<std::string> DeltaFilesOf(const std::vector<ShardFile>& files,
                                      int shard_index, int num_shards);

// Lists `dir` and returns DeltaFilesOf its files (none when it is absent).
absl::StatusOr<std::vector<std::string>> ListDeltaFiles(
    const std::string& dir, int shard_index, int num_shards,
    FileSystem* fs = nullptr);

// Removes every delta of the shard from `dir` and syncs the directory (once
// a new full checkpoint is durable, they belong to no chain). Returns how
// many it removed; the first error (naming the file) otherwise.
absl::StatusOr<int> PruneDeltaFiles(const std::string& dir, int shard_index,
                                    int num_shards, FileSystem* fs);

// CheckpointDirUse::adopt_run that accepts the files of any run.
inline constexpr char kAdoptAnyRun[] = "any";

struct CheckpointDirUse {
  std::string dir;
  int shard_index = 0;
  int num_shards = 1;
  std::string run_id;  // this shard's run
  // Also accept this run's files ("" = none, kAdoptAnyRun = any run's).
  std::string adopt_run;
  bool restore = true;  // files are read (false: only overwritten)
  FileSystem* fs = FileSystem::Default();  // not owned; never null
};

// FAILED_PRECONDITION, naming the files, when `use.dir` holds files of
// another shard count (whatever `restore` says: they would be restored by a
// later start with that count, or mixed into a reshard), or when restoring
// and this shard's checkpoint or spec file belongs to a run other than
// use.run_id and use.adopt_run. DATA_LOSS for a corrupt file whose identity
// cannot be read; errors of listing the directory and of reading a file
// (e.g. NOT_FOUND for one that vanished after the listing), naming it.
absl::Status CheckCheckpointDir(const CheckpointDirUse& use);

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_CHECKPOINT_DIR_H_
