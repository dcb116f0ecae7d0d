#ifndef ASYNCPS_SERVER_SPEC_FILE_H_
#define ASYNCPS_SERVER_SPEC_FILE_H_

// The spec file of a shard: the specs of every tensor and sparse table it
// holds, made durable before CreateTensor answers, so that tensors survive
// a shard restart at any time, also one before the first checkpoint.
//
// <dir>/shard-<i>-of-<n>.specs is a record file (server/record_file.h,
// magic "APSSPEC\n", format 1) of CheckpointRecords: the identity (shard,
// shard count, run), then one `tensor` or `table` record per spec, then an
// `end` record with their counts. A restarting shard restores its
// checkpoint, then creates, with their initial values, the tensors and
// tables the spec file holds and the checkpoint does not (those created
// after it): exactly the state of a shard whose updates since the
// checkpoint were lost, which is the documented loss bound of a restart.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "proto/asyncps.pb.h"
#include "proto/checkpoint.pb.h"
#include "server/file_system.h"
#include "server/record_file.h"
#include "store/shard_store.h"

namespace asyncps {

extern const RecordFileFormat kSpecFileFormat;

// "<dir>/shard-<shard_index>-of-<num_shards>.specs".
std::string SpecFilePath(absl::string_view dir, int shard_index,
                         int num_shards);

struct SpecFileContents {
  CheckpointIdentity identity;
  std::vector<TensorSpec> tensors;
  std::vector<TableSpec> tables;
};

// Writes `contents` to `path` atomically, through `fs` (nullptr =
// FileSystem::Default()).
absl::Status WriteSpecFile(const std::string& path,
                           const SpecFileContents& contents,
                           FileSystem* fs = nullptr);

// Reads and validates a spec file through `fs` (nullptr =
// FileSystem::Default()): NOT_FOUND when there is none, DATA_LOSS when it is
// corrupt or reads back truncated, other I/O errors by errno (all naming the
// file).
absl::StatusOr<SpecFileContents> ReadSpecFile(const std::string& path,
                                              FileSystem* fs = nullptr);

// Creates in `store` the tensors and tables of `specs` it does not hold
// (with their initial values), checks that those it holds have the same
// created spec (DATA_LOSS naming the file and the tensor otherwise), and
// applies the file's schedules (a later step than the checkpoint's wins).
// Returns how many it created. A tensor created with INIT_VALUES cannot be
// created from its spec alone (its values are only in checkpoints): when the
// store lacks one, its name goes to `without_values` (if not null) instead.
// `path` is for messages.
absl::StatusOr<int> ApplySpecFile(
    const SpecFileContents& specs, const std::string& path, ShardStore* store,
    std::vector<std::string>* without_values = nullptr);

// Keeps a shard's spec file up to date with its store. Thread-safe.
class SpecJournal {
 public:
  // `identity` names the shard and its run (unix_time_ms is set at every
  // write). `store` is not owned and must outlive the journal; neither is
  // `fs` (nullptr = FileSystem::Default()), through which it writes.
  SpecJournal(std::string path, CheckpointIdentity identity,
              const ShardStore* store, FileSystem* fs = nullptr);

  // Makes every spec the store holds durable, with its schedule: rewrites
  // the file when the store holds specs or schedule steps the file does
  // not, and returns once it is on disk. Errors name the file; a later call
  // tries again.
  absl::Status Sync();

  // What the file holds now (as a restore read it): the next Sync writes
  // nothing when that is the store's specs under this journal's identity
  // already (a restarted shard's file, also on a full disk).
  void Known(SpecFileContents on_disk);

  const std::string& path() const { return path_; }

 private:
  const std::string path_;
  const CheckpointIdentity identity_;
  const ShardStore* const store_;
  FileSystem* const fs_;
  absl::Mutex mu_;  // serializes writers
  // Specs plus the sum of their schedule steps, as in the file.
  uint64_t durable_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<SpecFileContents> on_disk_ ABSL_GUARDED_BY(mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_SPEC_FILE_H_
