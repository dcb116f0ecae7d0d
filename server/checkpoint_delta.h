#ifndef ASYNCPS_SERVER_CHECKPOINT_DELTA_H_
#define ASYNCPS_SERVER_CHECKPOINT_DELTA_H_

// Incremental checkpoints: a delta file holds only what changed since the
// previous checkpoint of its chain, on top of a full checkpoint
// (server/checkpoint.h).
//
// A chain is one full checkpoint, <dir>/shard-<i>-of-<n>.ckpt, and the
// deltas written after it, <dir>/shard-<i>-of-<n>.delta-<k> for k = 1, 2,
// ... Each delta (magic "APSDELT\n", records of proto/checkpoint.proto)
// opens with a `delta` record naming the full checkpoint (its body's
// CRC-32, size and capture time), its sequence number k and the body CRC-32
// of delta k - 1, then holds every worker record and every tensor and table
// spec whole (they are small), the slices pushed to and the rows created or
// used (pulled or pushed) since the previous checkpoint of the chain, and
// per table the ids of the rows evicted since (so that a restore does not
// bring them back). Every file is CRC-32 checked and written atomically
// (server/record_file.h).
//
// A restore (RestoreCheckpoint with RestoreCheckpointOptions::deltas) reads
// the full checkpoint, then applies the deltas in order. A delta that is
// torn or corrupt, or that does not continue the chain (another full
// checkpoint's, a sequence number missing before it), is ignored together
// with every delta after it: what the shard loses is at most the updates
// since the last good file. An I/O error reading a delta fails the restore
// as one reading the full checkpoint does.
//
// Example (what the Checkpointer does):
//
//   DeltaChain chain = ...;  // from the full checkpoint just written
//   CheckpointImage delta =
//       CaptureDelta(store, workers, absl::Now(), since, chain);
//   uint32_t crc = 0;
//   absl::StatusOr<CheckpointInfo> info =
//       WriteCheckpoint(delta, dir, Clock::Real(), fs, &crc);
//   // the next delta: chain.sequence + 1, previous_crc = crc

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/checkpoint.pb.h"
#include "server/checkpoint.h"
#include "server/file_system.h"
#include "server/record_file.h"
#include "store/shard_store.h"

namespace asyncps {

// The record file format of deltas (magic "APSDELT\n", version 1).
extern const RecordFileFormat kDeltaFormat;

// "<dir>/shard-<shard_index>-of-<num_shards>.delta-<sequence>".
std::string DeltaPath(absl::string_view dir, int shard_index, int num_shards,
                      uint64_t sequence);

// Where the next delta goes in its chain.
struct DeltaChain {
  uint32_t base_crc = 0;  // the full checkpoint's body CRC-32
  uint64_t base_bytes = 0;
  int64_t base_unix_time_ms = 0;
  uint64_t sequence = 1;      // of the delta to write
  uint32_t previous_crc = 0;  // delta sequence - 1's body CRC-32; 0 for 1
};

// Serializes a delta of the store into an image taken at `now`: every
// worker record, tensor and table spec, and the slices and rows changed
// (and row ids evicted) at or after ChangeEpoch `since`. A consistent cut
// as CaptureCheckpoint's (the caller holds the push gate closed).
CheckpointImage CaptureDelta(const ShardStore& store,
                             const std::vector<CheckpointWorker>& workers,
                             absl::Time now, uint32_t since,
                             const DeltaChain& chain,
                             absl::string_view build_version = "",
                             absl::string_view run_id = "");

// The full checkpoint a restore read, which its deltas must name.
struct DeltaBase {
  CheckpointIdentity identity;
  uint32_t crc = 0;
  uint64_t bytes = 0;
};

// What ApplyDeltas did.
struct AppliedDeltas {
  int applied = 0;
  int ignored = 0;
  // Why the first ignored delta was (naming it); empty when none was.
  std::string ignored_reason;
  // The worker records of the last delta applied (replacing the full
  // checkpoint's); meaningful only when applied > 0.
  std::vector<CheckpointWorker> workers;
  uint64_t bytes = 0;        // of the deltas applied
  int64_t unix_time_ms = 0;  // the last one's capture time
};

// Applies the deltas at `paths` (in sequence order, as ListDeltaFiles gives
// them) to `store`, restored from the full checkpoint `base`, through `fs`
// (nullptr = FileSystem::Default()), each read whole and checked before any
// of it is applied. Stops at the first delta that is torn, corrupt or does
// not continue the chain (counted as ignored with the ones after it).
// Errors: I/O errors of reading a delta (e.g. NOT_FOUND when it vanished
// after the listing), and DATA_LOSS / RESOURCE_EXHAUSTED of applying an
// intact delta; the store must then be discarded.
absl::StatusOr<AppliedDeltas> ApplyDeltas(const DeltaBase& base,
                                          const std::vector<std::string>& paths,
                                          ShardStore* store,
                                          FileSystem* fs = nullptr);

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_CHECKPOINT_DELTA_H_
