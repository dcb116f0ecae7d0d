#ifndef ASYNCPS_SERVER_CHECKPOINT_H_
#define ASYNCPS_SERVER_CHECKPOINT_H_

// Checkpoint files of one shard: the writer and the reader.
//
// A checkpoint holds every tensor spec and every local slice of a ShardStore
// (index, version, values, optimizer state) together with the shard's
// identity (shard_index, num_shards), in one file per shard:
// <dir>/shard-<i>-of-<n>.ckpt. The layout (header, length-prefixed
// protobuf records, CRC-32 trailer) is described in proto/checkpoint.proto.
//
// Atomicity: the writer fills <file>.tmp, fsyncs it, renames it over <file>
// and fsyncs the directory, so after a crash at any point <file> is either
// the previous complete checkpoint or the new one. A leftover .tmp is never
// read; the next write replaces it.
//
// Consistency: the store keeps serving while a checkpoint is written. Each
// slice is copied under its own lock, one at a time, so each slice in the
// file is internally consistent (values and optimizer state are exactly
// those after `version` updates), but different slices may be from
// different moments: the checkpoint is "fuzzy" across slices, and the
// versions say exactly which updates each slice holds. For async SGD this
// is the same view a worker's pull gets.
//
// Not restored: workers' clocks and leases and the push de-duplication
// table start empty. Workers that outlive a shard restart re-register
// (incarnations are new on every worker start); a push retried across the
// restart may be applied again.

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/asyncps.pb.h"
#include "server/shard_store.h"

namespace asyncps {

// "<dir>/shard-<shard_index>-of-<num_shards>.ckpt".
std::string CheckpointPath(absl::string_view dir, int shard_index,
                           int num_shards);

// Writes the checkpoint of `store` (its identity from store.options()) to
// CheckpointPath(dir, ...) atomically, as described above. Returns what was
// written: path, start time, bytes, duration, tensors, slices. On error
// (naming the file) the previous checkpoint is untouched and the .tmp is
// removed. Holds no store-wide lock; concurrent writers to the same `dir`
// and shard must be serialized by the caller.
absl::StatusOr<CheckpointInfo> WriteCheckpoint(
    const ShardStore& store, absl::string_view dir,
    absl::string_view build_version = "");

// Loads the checkpoint at `path` into `store`, which must hold no tensors.
// Every record is validated (magic, format version, record lengths, the
// CRC-32, the slices against their specs, every local slice present
// exactly once). Errors name the file:
//   NOT_FOUND            no such file (other I/O errors by errno);
//   DATA_LOSS            corrupt or truncated file;
//   FAILED_PRECONDITION  an intact file of another shard or cluster size,
//                        or a store that is not empty.
// On error the store may hold part of the checkpoint and must be discarded.
// Returns the file's path, start time (from the file), bytes, restore
// duration, tensors and slices.
absl::StatusOr<CheckpointInfo> RestoreCheckpoint(const std::string& path,
                                                 ShardStore* store);

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_CHECKPOINT_H_
