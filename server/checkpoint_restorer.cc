#include "server/checkpoint_restorer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/names.h"
#include "common/tensor_layout.h"
#include "server/checkpoint.h"
#include "server/checkpoint_records.h"

namespace asyncps {

CheckpointRestorer::CheckpointRestorer(const std::string& path,
                                       ShardStore* store, bool delta)
    : path_(path), store_(store), delta_(delta) {
  if (!delta_) return;
  for (const TensorSpec& t : store_->ListTensors()) existing_.insert(t.name());
  for (const TableSpec& t : store_->tables().List()) existing_.insert(t.name());
}

absl::Status CheckpointRestorer::Corrupt(absl::string_view what) const {
  return absl::DataLossError(absl::StrCat(
      delta_ ? "checkpoint delta " : "checkpoint ", path_, ": ", what));
}

absl::Status CheckpointRestorer::StoreError(const absl::Status& s,
                                            absl::string_view what) const {
  if (absl::IsResourceExhausted(s)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("checkpoint ", path_, ": ", s.message()));
  }
  return Corrupt(what.empty() ? s.message()
                              : absl::StrCat(what, ": ", s.message()));
}

absl::Status CheckpointRestorer::ApplyHeader(const CheckpointRecord& record,
                                             int64_t n) {
  if (n != 0) return Corrupt("a second identity record");
  if (record.has_delta() != delta_) {
    return Corrupt(delta_ ? "the first record is not the delta header"
                          : "the first record is not the shard identity");
  }
  identity_ = delta_ ? record.delta().identity() : record.identity();
  if (identity_.shard_index() != store_->options().shard_index ||
      identity_.num_shards() != store_->options().num_shards) {
    // Reported only if the rest of the file is intact: a corrupt byte in
    // the identity must read as corruption.
    wrong_shard_ = true;
  }
  const absl::StatusOr<ShardMap> written = IdentityMap(identity_);
  if (!written.ok()) return Corrupt(written.status().message());
  if (!MapRestoresInto(*written, store_->map())) {
    wrong_map_ = written->DebugString();
  }
  return absl::OkStatus();
}

absl::Status CheckpointRestorer::Apply(const CheckpointRecord& record,
                                       int64_t n) {
  if (n == 0 && !record.has_identity() && !record.has_delta()) {
    return Corrupt(delta_ ? "the first record is not the delta header"
                          : "the first record is not the shard identity");
  }
  if (end_seen_) return Corrupt("records follow the end record");
  switch (record.record_case()) {
    case CheckpointRecord::kIdentity:
    case CheckpointRecord::kDelta:
      return ApplyHeader(record, n);
    case CheckpointRecord::kWorker:
      if (in_tensor_ || in_tables_) {
        return Corrupt("a worker record after the tensors");
      }
      if (record.worker().worker_id() < 0 ||
          record.worker().incarnation() == 0 || record.worker().clock() < 0) {
        return Corrupt(absl::StrCat("worker record ", n, " is malformed"));
      }
      workers_.push_back(record.worker());
      return absl::OkStatus();
    case CheckpointRecord::kTensor:
      if (in_tables_) return Corrupt("a tensor record after the tables");
      return Skipping() ? absl::OkStatus() : StartTensor(record.tensor());
    case CheckpointRecord::kTable:
      return Skipping() ? absl::OkStatus() : StartTable(record.table());
    case CheckpointRecord::kRows:
      return Skipping() ? absl::OkStatus() : AddRows(record.rows());
    case CheckpointRecord::kRemoved:
      if (!delta_) return Corrupt("a removed-rows record in a full checkpoint");
      return Skipping() ? absl::OkStatus() : RemoveRows(record.removed());
    case CheckpointRecord::kSlice:
      return Skipping() ? absl::OkStatus() : AddSlice(record.slice());
    case CheckpointRecord::kEnd:
      end_seen_ = true;
      return Skipping() ? absl::OkStatus() : ApplyEnd(record.end());
    default:
      return Corrupt(absl::StrCat("record ", n, " is of an unknown kind"));
  }
}

absl::Status CheckpointRestorer::ApplyEnd(const CheckpointEnd& end) {
  absl::Status s = FinishTensor();
  if (!s.ok()) return s;
  if (end.tensors() != tensors_ || end.slices() != slices_ ||
      end.tables() != tables_ || end.rows() != rows_ ||
      end.removed_rows() != removed_) {
    return Corrupt(absl::StrCat(
        "the end record counts ", end.tensors(), " tensors, ", end.slices(),
        " slices, ", end.tables(), " tables, ", end.rows(), " rows and ",
        end.removed_rows(), " removed rows; the file holds ", tensors_, ", ",
        slices_, ", ", tables_, ", ", rows_, " and ", removed_));
  }
  return absl::OkStatus();
}

absl::Status CheckpointRestorer::Finish() const {
  if (!end_seen_) {
    return Corrupt("no end record (truncated or written by a crashed writer)");
  }
  if (wrong_shard_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", path_, " belongs to shard ", identity_.shard_index(),
        " of ", identity_.num_shards(), ", not to this shard ",
        store_->options().shard_index, " of ", store_->options().num_shards));
  }
  if (!wrong_map_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", path_, " was written under the ", wrong_map_,
        "; this shard serves the ", store_->map().DebugString(),
        ": start it with the files' map (--num_slots) or move the files to "
        "this map with psctl reshard --map"));
  }
  return absl::OkStatus();
}

absl::Status CheckpointRestorer::StartTensor(const TensorSpec& spec) {
  absl::Status s = FinishTensor();
  if (!s.ok()) return s;
  const bool exists = delta_ && existing_.contains(spec.name());
  if (!exists) {
    s = store_->RestoreTensor(spec);
    if (!s.ok()) {
      return StoreError(s, absl::StrCat("tensor ", QuoteName(spec.name())));
    }
  }
  absl::StatusOr<TensorLayout> layout = TensorLayout::FromSpec(spec);
  if (!layout.ok()) {
    return Corrupt(absl::StrCat("tensor ", QuoteName(spec.name()), ": ",
                                layout.status().message()));
  }
  tensor_ = spec.name();
  in_tensor_ = true;
  restored_.assign(layout->num_slices(), false);
  // A delta holds only the changed slices of a tensor the store had.
  expected_ = -1;
  if (!exists) {
    expected_ = store_->map().SlicesOn(spec.name(), layout->num_slices(),
                                       store_->options().shard_index);
  }
  got_ = 0;
  ++tensors_;
  return absl::OkStatus();
}

absl::Status CheckpointRestorer::AddSlice(const CheckpointSlice& slice) {
  if (!in_tensor_) return Corrupt("a slice record before any tensor");
  const std::string where =
      absl::StrCat("slice ", slice.index(), " of tensor ", QuoteName(tensor_));
  if (slice.index() < restored_.size() && restored_[slice.index()]) {
    return Corrupt(absl::StrCat(where, " appears twice"));
  }
  const std::vector<absl::string_view> state = SliceStateOf(slice);
  absl::Status s = store_->RestoreSlice(tensor_, slice.index(), slice.version(),
                                        slice.values(), state);
  if (!s.ok()) return Corrupt(s.message());
  restored_[slice.index()] = true;
  ++got_;
  ++slices_;
  slice_updates_ += slice.version();
  return absl::OkStatus();
}

absl::Status CheckpointRestorer::StartTable(const TableSpec& spec) {
  absl::Status s = FinishTensor();
  if (!s.ok()) return s;
  in_tensor_ = false;
  in_tables_ = true;
  if (!(delta_ && existing_.contains(spec.name()))) {
    s = store_->tables().RestoreTable(spec);
    if (!s.ok()) {
      return StoreError(s, absl::StrCat("table ", QuoteName(spec.name())));
    }
  }
  table_ = spec.name();
  ++tables_;
  return absl::OkStatus();
}

absl::Status CheckpointRestorer::AddRows(const CheckpointRows& rows) {
  if (!in_tables_) return Corrupt("a rows record before any table");
  const RowColumns c = ColumnsOf(rows);
  absl::Status s = store_->tables().RestoreRows(
      table_, c.ids, c.versions, c.touched, rows.values(),
      rows.optimizer_state(), /*replace=*/delta_);
  if (!s.ok()) return StoreError(s, "");
  rows_ += rows.ids_size();
  return absl::OkStatus();
}

absl::Status CheckpointRestorer::RemoveRows(
    const CheckpointRemovedRows& removed) {
  if (!in_tables_) return Corrupt("a removed-rows record before any table");
  absl::Status s = store_->tables().RemoveRows(
      table_, absl::MakeConstSpan(removed.ids().data(), removed.ids_size()));
  if (!s.ok()) return Corrupt(s.message());
  removed_ += removed.ids_size();
  return absl::OkStatus();
}

absl::Status CheckpointRestorer::FinishTensor() {
  if (!in_tensor_ || expected_ < 0 || got_ == expected_) {
    return absl::OkStatus();
  }
  return Corrupt(absl::StrCat("tensor ", QuoteName(tensor_), " has ", expected_,
                              " slices on this shard; the file holds ", got_));
}

}  // namespace asyncps
