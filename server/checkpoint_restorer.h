#ifndef ASYNCPS_SERVER_CHECKPOINT_RESTORER_H_
#define ASYNCPS_SERVER_CHECKPOINT_RESTORER_H_

// Applies the records of one checkpoint file to a ShardStore and checks
// that they form a whole file of their kind: a full checkpoint
// (server/checkpoint.h) into an empty store, or a delta
// (server/checkpoint_delta.h) on top of the full checkpoint and the deltas
// before it. Internal to the checkpoint library.
//
// Example:
//
//   CheckpointRestorer restorer(path, store, /*delta=*/false);
//   // for every record n of the file, as it is read:
//   absl::Status s = restorer.Apply(record, n);
//   // once the file's checksum is checked:
//   s = restorer.Finish();
//
// Not thread-safe.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/checkpoint.pb.h"
#include "store/shard_store.h"

namespace asyncps {

class CheckpointRestorer {
 public:
  // `path` names the file in errors; `store` (not owned) receives the
  // records. A delta's tensors and tables that the store holds keep their
  // state except for the slices and rows the delta holds; new ones must be
  // whole in it.
  CheckpointRestorer(const std::string& path, ShardStore* store, bool delta);

  // Applies one record, the n-th (0-based) in the body. DATA_LOSS for a
  // record out of place or malformed; RESOURCE_EXHAUSTED when the store's
  // cap is too small.
  absl::Status Apply(const CheckpointRecord& record, int64_t n);

  // After the CRC check: the outcome for an intact file.
  absl::Status Finish() const;

  // The identity (of a delta: the one its `delta` record names).
  const CheckpointIdentity& identity() const { return identity_; }
  int32_t tensors() const { return tensors_; }
  int64_t slices() const { return slices_; }
  uint64_t slice_updates() const { return slice_updates_; }
  int32_t tables() const { return tables_; }
  int64_t rows() const { return rows_; }
  int64_t removed_rows() const { return removed_; }
  std::vector<CheckpointWorker> TakeWorkers() { return std::move(workers_); }

  absl::Status Corrupt(absl::string_view what) const;

 private:
  absl::Status ApplyHeader(const CheckpointRecord& record, int64_t n);
  absl::Status ApplyEnd(const CheckpointEnd& end);
  absl::Status StartTensor(const TensorSpec& spec);
  absl::Status AddSlice(const CheckpointSlice& slice);
  absl::Status StartTable(const TableSpec& spec);
  absl::Status AddRows(const CheckpointRows& rows);
  absl::Status RemoveRows(const CheckpointRemovedRows& removed);
  absl::Status FinishTensor();
  // RESOURCE_EXHAUSTED stays that (naming the file); other errors of the
  // store are corruption of `what`.
  absl::Status StoreError(const absl::Status& s, absl::string_view what) const;

  const std::string& path_;
  ShardStore* const store_;
  const bool delta_;
  // Delta: the tensors and tables the store held before it.
  absl::flat_hash_set<std::string> existing_;
  CheckpointIdentity identity_;
  bool wrong_shard_ = false;
  // The map the file was written under, when it does not restore into the
  // store's (MapRestoresInto); empty otherwise.
  std::string wrong_map_;
  // Records of a file for another shard or map are read (so corruption
  // still reads as corruption) but not applied.
  bool Skipping() const { return wrong_shard_ || !wrong_map_.empty(); }
  bool end_seen_ = false;
  // The tensor whose slices are being read.
  bool in_tensor_ = false;
  std::string tensor_;
  std::vector<bool> restored_;
  int64_t expected_ = 0;  // its slices the file must hold; -1 = any
  int64_t got_ = 0;
  int32_t tensors_ = 0;
  int64_t slices_ = 0;
  uint64_t slice_updates_ = 0;
  // The table whose rows are being read (format 3).
  bool in_tables_ = false;
  std::string table_;
  int32_t tables_ = 0;
  int64_t rows_ = 0;
  int64_t removed_ = 0;
  std::vector<CheckpointWorker> workers_;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_CHECKPOINT_RESTORER_H_
