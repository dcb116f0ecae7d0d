#ifndef ASYNCPS_SERVER_CHECKPOINT_H_
#define ASYNCPS_SERVER_CHECKPOINT_H_

// Checkpoint files of one shard: capture, writer and reader.
//
// A checkpoint holds every tensor spec and every local slice of a ShardStore
// (index, version, values, optimizer state), every sparse table spec and
// its local rows (id, version, last use, values, optimizer state), every
// worker record of the
// shard's WorkerRegistry (identity for fencing, clock, the push
// de-duplication window) and the shard's identity (shard_index,
// num_shards), in one file per shard: <dir>/shard-<i>-of-<n>.ckpt. The
// layout (header, length-prefixed protobuf records, CRC-32 trailer) is
// described in proto/checkpoint.proto; the container (header, records,
// CRC-32, atomic write) in server/record_file.h. A checkpoint also names the
// run it belongs to (ps_server --run_id).
//
// Consistency: the shard captures the image while no push is being applied
// (server/push_gate.h), so it is one cut: the pushes the worker records
// list as applied are exactly those the slices hold. A push acknowledged
// before the capture and retried after a restore is acknowledged as a
// duplicate, not applied again. The capture copies (serializes) the state
// in memory, then pushes go on while the image is written.
//
// Atomicity: as every record file's (server/record_file.h): after a crash
// at any point <file> is either the previous complete checkpoint or the new
// one.

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/shard_map.h"
#include "proto/asyncps.pb.h"
#include "proto/checkpoint.pb.h"
#include "server/file_system.h"
#include "server/record_file.h"
#include "store/shard_store.h"

namespace asyncps {

// A shard's state serialized in memory: the body records of a checkpoint.
struct CheckpointImage {
  int shard_index = 0;
  int num_shards = 1;
  absl::Time taken;                  // when the capture started
  std::vector<std::string> records;  // serialized CheckpointRecords, in order
  uint64_t body_bytes = 0;           // records with their length prefixes
  int32_t tensors = 0;
  int64_t slices = 0;
  int32_t workers = 0;
  uint64_t slice_updates = 0;  // sum of the slice versions
  int32_t tables = 0;
  int64_t rows = 0;
  // How long pushes were held back for the capture (set by the capturer).
  absl::Duration pause;
  // A delta (server/checkpoint_delta.h): its sequence number and the row
  // ids it records as evicted.
  bool delta = false;
  uint64_t delta_sequence = 0;
  int64_t removed_rows = 0;
  // The ChangeEpoch the capturer started before capturing (set by it): the
  // next delta holds what changed from then on.
  uint32_t epoch = 0;
};

// "<dir>/shard-<shard_index>-of-<num_shards>.ckpt".
std::string CheckpointPath(absl::string_view dir, int shard_index,
                           int num_shards);

// The record file format of checkpoints (magic "APSCKPT\n", versions 1-3).
extern const RecordFileFormat kCheckpointFormat;

// Serializes the store's tensors and slices (each slice under its own lock)
// and the worker records into an image taken at `now`, of run `run_id`. A
// consistent cut only if no push is applied meanwhile: the caller holds the
// shard's push gate closed.
CheckpointImage CaptureCheckpoint(const ShardStore& store,
                                  const std::vector<CheckpointWorker>& workers,
                                  absl::Time now,
                                  absl::string_view build_version = "",
                                  absl::string_view run_id = "");

// Writes `image` to CheckpointPath(dir, ...) (a delta's to DeltaPath)
// atomically, as described above, through `fs` (nullptr =
// FileSystem::Default(); tests inject faults); `crc` (if given) receives
// the body's CRC-32, which the next delta of the chain names.
// Returns what was written: path, capture time, bytes, duration (write
// only), tensors, slices, workers, slice updates. On error (naming the file)
// the previous checkpoint is untouched and the .tmp is removed. Concurrent
// writers to the same `dir` and shard must be serialized by the caller.
absl::StatusOr<CheckpointInfo> WriteCheckpoint(const CheckpointImage& image,
                                               absl::string_view dir,
                                               Clock* clock = Clock::Real(),
                                               FileSystem* fs = nullptr,
                                               uint32_t* crc = nullptr);

// What a restore loaded besides the store's slices.
struct RestoredCheckpoint {
  CheckpointInfo info;  // path, capture time, bytes, restore duration, counts
  CheckpointIdentity identity;            // whose state it is (shard, run)
  std::vector<CheckpointWorker> workers;  // for WorkerRegistry::Import
  // Why deltas were ignored (info.deltas_ignored), naming the first.
  std::string deltas_ignored_reason;
};

// How RestoreCheckpoint reads.
struct RestoreCheckpointOptions {
  // Where the file is read from; nullptr = FileSystem::Default(). Not owned.
  FileSystem* fs = nullptr;
  // If set, called about every `progress_every` while the file is read,
  // with the bytes read so far (a large restore can take minutes).
  std::function<void(uint64_t bytes_read)> progress;
  absl::Duration progress_every = absl::Seconds(5);
  // The deltas of the checkpoint's chain (server/checkpoint_delta.h), in
  // sequence order (ListDeltaFiles), applied after it; the worker records
  // are the last applied delta's.
  std::vector<std::string> deltas;
};

// Loads the checkpoint at `path` into `store`, which must hold no tensors
// and no tables, then the deltas of options.deltas that continue its chain
// (ApplyDeltas: a torn or corrupt one is ignored with the ones after it).
// Every record is validated (magic, format version 1 to 3, record lengths,
// the CRC-32, the slices against their specs, every local slice present
// exactly once, rows against their tables and homed here, worker records
// well-formed). Errors name the file:
//   NOT_FOUND            no such file (other I/O errors by errno: an error
//                        of opening or reading it);
//   DATA_LOSS            corrupt or truncated file (also one that reads
//                        back shorter than its size);
//   FAILED_PRECONDITION  an intact file of another shard or cluster size,
//                        or a store that is not empty;
//   RESOURCE_EXHAUSTED   the tensors exceed the store's max_parameter_bytes.
// On error the store may hold part of the checkpoint and must be discarded
// (a shard that fails its restore does not start; RestoreShard returns no
// store).
absl::StatusOr<RestoredCheckpoint> RestoreCheckpoint(
    const std::string& path, ShardStore* store,
    const RestoreCheckpointOptions& options = {});

// The identity record of the checkpoint at `path`, read through `fs`
// (nullptr = FileSystem::Default()) without the rest of the file (no
// checksum: RestoreCheckpoint still validates the file). Errors as
// RestoreCheckpoint's NOT_FOUND (and other I/O errors) and DATA_LOSS.
absl::StatusOr<CheckpointIdentity> ReadCheckpointIdentity(
    const std::string& path, FileSystem* fs = nullptr);

// Records `map` in `identity` (a slotted map; the static map is recorded as
// no map, so static runs' files stay as they were).
void SetIdentityMap(const ShardMap& map, CheckpointIdentity* identity);

// The map a file with `identity` was written under (INVALID_ARGUMENT for a
// malformed one).
absl::StatusOr<ShardMap> IdentityMap(const CheckpointIdentity& identity);

// Whether a file written under `written` restores into a shard serving
// `serving`: the same map, or a static map and the even slotted map of the
// same shard count when that count divides the slot count (every key is
// where it was).
bool MapRestoresInto(const ShardMap& written, const ShardMap& serving);

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_CHECKPOINT_H_
