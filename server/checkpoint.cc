#include "server/checkpoint.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/names.h"
#include "common/payload.h"
#include "common/shard_map.h"
#include "common/tensor_layout.h"
#include "proto/checkpoint.pb.h"
#include "server/record_file.h"

namespace asyncps {
namespace {

// 3: sparse tables; 2: worker records; 1: tensors only.
constexpr uint32_t kFormatVersion = 3;
constexpr size_t kLengthBytes = 4;
// Rows of a sparse table per record.
constexpr int kRowsPerRecord = 4096;

// Appends one serialized record to an image, counting its bytes.
void AddRecord(const CheckpointRecord& record, CheckpointImage* image) {
  image->records.emplace_back();
  std::string& bytes = image->records.back();
  record.SerializeToString(&bytes);
  image->body_bytes += kLengthBytes + bytes.size();
}

// Restores records into the store and checks that they form a complete
// checkpoint of the store's shard.
class Restorer {
 public:
  Restorer(const std::string& path, ShardStore* store)
      : path_(path), store_(store) {}

  // Applies one record, the n-th (0-based) in the body.
  absl::Status Apply(const CheckpointRecord& record, int64_t n) {
    if (n == 0 && !record.has_identity()) {
      return Corrupt("the first record is not the shard identity");
    }
    if (end_seen_) return Corrupt("records follow the end record");
    switch (record.record_case()) {
      case CheckpointRecord::kIdentity:
        if (n != 0) return Corrupt("a second identity record");
        identity_ = record.identity();
        if (identity_.shard_index() != store_->options().shard_index ||
            identity_.num_shards() != store_->options().num_shards) {
          // Reported only if the rest of the file is intact: a corrupt byte
          // in the identity must read as corruption.
          wrong_shard_ = true;
        }
        return absl::OkStatus();
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
        return wrong_shard_ ? absl::OkStatus() : StartTensor(record.tensor());
      case CheckpointRecord::kTable:
        return wrong_shard_ ? absl::OkStatus() : StartTable(record.table());
      case CheckpointRecord::kRows:
        return wrong_shard_ ? absl::OkStatus() : AddRows(record.rows());
      case CheckpointRecord::kSlice:
        return wrong_shard_ ? absl::OkStatus() : AddSlice(record.slice());
      case CheckpointRecord::kEnd: {
        end_seen_ = true;
        if (wrong_shard_) return absl::OkStatus();
        absl::Status s = FinishTensor();
        if (!s.ok()) return s;
        if (record.end().tensors() != tensors_ ||
            record.end().slices() != slices_ ||
            record.end().tables() != tables_ || record.end().rows() != rows_) {
          return Corrupt(absl::StrCat(
              "the end record counts ", record.end().tensors(), " tensors, ",
              record.end().slices(), " slices, ", record.end().tables(),
              " tables and ", record.end().rows(), " rows; the file holds ",
              tensors_, ", ", slices_, ", ", tables_, " and ", rows_));
        }
        return absl::OkStatus();
      }
      default:
        return Corrupt(absl::StrCat("record ", n, " is of an unknown kind"));
    }
  }

  // After the CRC check: the outcome for an intact file.
  absl::Status Finish() const {
    if (!end_seen_) {
      return Corrupt(
          "no end record (truncated or written by a crashed writer)");
    }
    if (wrong_shard_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", path_, " belongs to shard ", identity_.shard_index(),
          " of ", identity_.num_shards(), ", not to this shard ",
          store_->options().shard_index, " of ", store_->options().num_shards));
    }
    return absl::OkStatus();
  }

  const CheckpointIdentity& identity() const { return identity_; }
  int32_t tensors() const { return tensors_; }
  int64_t slices() const { return slices_; }
  uint64_t slice_updates() const { return slice_updates_; }
  int32_t tables() const { return tables_; }
  int64_t rows() const { return rows_; }
  std::vector<CheckpointWorker> TakeWorkers() { return std::move(workers_); }

  absl::Status Corrupt(absl::string_view what) const {
    return absl::DataLossError(absl::StrCat("checkpoint ", path_, ": ", what));
  }

 private:
  absl::Status StartTensor(const TensorSpec& spec) {
    absl::Status s = FinishTensor();
    if (!s.ok()) return s;
    s = store_->RestoreTensor(spec);
    if (absl::IsResourceExhausted(s)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("checkpoint ", path_, ": ", s.message()));
    }
    if (!s.ok()) {
      return Corrupt(
          absl::StrCat("tensor ", QuoteName(spec.name()), ": ", s.message()));
    }
    absl::StatusOr<TensorLayout> layout = TensorLayout::FromSpec(spec);
    if (!layout.ok()) {
      return Corrupt(absl::StrCat("tensor ", QuoteName(spec.name()), ": ",
                                  layout.status().message()));
    }
    tensor_ = spec.name();
    in_tensor_ = true;
    restored_.assign(layout->num_slices(), false);
    expected_ = store_->map().SlicesOn(spec.name(), layout->num_slices(),
                                       store_->options().shard_index);
    got_ = 0;
    ++tensors_;
    return absl::OkStatus();
  }

  absl::Status AddSlice(const CheckpointSlice& slice) {
    if (!in_tensor_) return Corrupt("a slice record before any tensor");
    const std::string where = absl::StrCat("slice ", slice.index(),
                                           " of tensor ", QuoteName(tensor_));
    if (slice.index() < restored_.size() && restored_[slice.index()]) {
      return Corrupt(absl::StrCat(where, " appears twice"));
    }
    std::vector<absl::string_view> state(slice.optimizer_state().begin(),
                                         slice.optimizer_state().end());
    absl::Status s = store_->RestoreSlice(
        tensor_, slice.index(), slice.version(), slice.values(), state);
    if (!s.ok()) return Corrupt(s.message());
    restored_[slice.index()] = true;
    ++got_;
    ++slices_;
    slice_updates_ += slice.version();
    return absl::OkStatus();
  }

  absl::Status StartTable(const TableSpec& spec) {
    absl::Status s = FinishTensor();
    if (!s.ok()) return s;
    in_tensor_ = false;
    in_tables_ = true;
    s = store_->tables().RestoreTable(spec);
    if (absl::IsResourceExhausted(s)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("checkpoint ", path_, ": ", s.message()));
    }
    if (!s.ok()) {
      return Corrupt(
          absl::StrCat("table ", QuoteName(spec.name()), ": ", s.message()));
    }
    table_ = spec.name();
    ++tables_;
    return absl::OkStatus();
  }

  absl::Status AddRows(const CheckpointRows& rows) {
    if (!in_tables_) return Corrupt("a rows record before any table");
    absl::Status s = store_->tables().RestoreRows(
        table_, absl::MakeConstSpan(rows.ids().data(), rows.ids_size()),
        absl::MakeConstSpan(rows.versions().data(), rows.versions_size()),
        absl::MakeConstSpan(rows.touched().data(), rows.touched_size()),
        rows.values(), rows.optimizer_state());
    if (absl::IsResourceExhausted(s)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("checkpoint ", path_, ": ", s.message()));
    }
    if (!s.ok()) return Corrupt(s.message());
    rows_ += rows.ids_size();
    return absl::OkStatus();
  }

  absl::Status FinishTensor() {
    if (!in_tensor_ || got_ == expected_) return absl::OkStatus();
    return Corrupt(
        absl::StrCat("tensor ", QuoteName(tensor_), " has ", expected_,
                     " slices on this shard; the file holds ", got_));
  }

  const std::string& path_;
  ShardStore* const store_;
  CheckpointIdentity identity_;
  bool wrong_shard_ = false;
  bool end_seen_ = false;
  // The tensor whose slices are being read.
  bool in_tensor_ = false;
  std::string tensor_;
  std::vector<bool> restored_;
  int64_t expected_ = 0;
  int64_t got_ = 0;
  int32_t tensors_ = 0;
  int64_t slices_ = 0;
  uint64_t slice_updates_ = 0;
  // The table whose rows are being read (format 3).
  bool in_tables_ = false;
  std::string table_;
  int32_t tables_ = 0;
  int64_t rows_ = 0;
  std::vector<CheckpointWorker> workers_;
};

// Appends a `table` record per sparse table and `rows` records of up to
// kRowsPerRecord rows, each row copied under its partition's lock.
void CaptureTables(const TableStore& tables, CheckpointImage* image) {
  CheckpointRecord record;
  CheckpointRecord rows_record;
  CheckpointRows* rows = rows_record.mutable_rows();
  auto flush = [&] {
    if (rows->ids_size() == 0) return;
    AddRecord(rows_record, image);
    rows->Clear();
  };
  tables
      .Export(
          [&](const TableSpec& spec) {
            flush();
            *record.mutable_table() = spec;
            AddRecord(record, image);
            ++image->tables;
            return absl::OkStatus();
          },
          [&](const SparseTable::RowView& r) {
            rows->add_ids(r.id);
            rows->add_versions(r.version);
            rows->add_touched(r.touched);
            rows->mutable_values()->append(
                reinterpret_cast<const char*>(r.values), r.dim * sizeof(float));
            rows->mutable_optimizer_state()->append(
                reinterpret_cast<const char*>(r.state),
                r.state_floats * sizeof(float));
            ++image->rows;
            if (rows->ids_size() >= kRowsPerRecord) flush();
            return absl::OkStatus();
          })
      .IgnoreError();  // the visitors never fail
  flush();
}

}  // namespace

std::string CheckpointPath(absl::string_view dir, int shard_index,
                           int num_shards) {
  return ShardFilePath(dir, shard_index, num_shards, "ckpt");
}

const RecordFileFormat kCheckpointFormat = {
    /*magic=*/absl::string_view("APSCKPT\n", 8), /*version=*/kFormatVersion,
    /*oldest_readable=*/1, /*what=*/"checkpoint"};

CheckpointImage CaptureCheckpoint(const ShardStore& store,
                                  const std::vector<CheckpointWorker>& workers,
                                  absl::Time now,
                                  absl::string_view build_version,
                                  absl::string_view run_id) {
  CheckpointImage image;
  image.shard_index = store.options().shard_index;
  image.num_shards = store.options().num_shards;
  image.taken = now;
  CheckpointRecord record;
  CheckpointIdentity* identity = record.mutable_identity();
  identity->set_shard_index(image.shard_index);
  identity->set_num_shards(image.num_shards);
  identity->set_unix_time_ms(absl::ToUnixMillis(now));
  identity->set_build_version(std::string(build_version));
  identity->set_run_id(std::string(run_id));
  AddRecord(record, &image);
  for (const CheckpointWorker& w : workers) {
    *record.mutable_worker() = w;
    AddRecord(record, &image);
    ++image.workers;
  }
  // Kept apart so that its buffers are reused from slice to slice.
  CheckpointRecord slice_record;
  CheckpointSlice* slice = slice_record.mutable_slice();
  store
      .Export(
          [&](const TensorSpec& spec) {
            *record.mutable_tensor() = spec;
            AddRecord(record, &image);
            ++image.tensors;
            return absl::OkStatus();
          },
          [&](const ShardStore::SliceView& v) {
            // Serialized under the slice's lock: the one copy.
            slice->set_index(v.index);
            slice->set_version(v.version);
            EncodeFloats(v.values.data(), v.values.size(),
                         slice->mutable_values());
            auto* state = slice->mutable_optimizer_state();
            while (state->size() > static_cast<int>(v.optimizer_state.size())) {
              state->RemoveLast();
            }
            while (state->size() < static_cast<int>(v.optimizer_state.size())) {
              state->Add();
            }
            for (size_t i = 0; i < v.optimizer_state.size(); ++i) {
              EncodeFloats(v.optimizer_state[i].data(),
                           v.optimizer_state[i].size(), state->Mutable(i));
            }
            AddRecord(slice_record, &image);
            ++image.slices;
            image.slice_updates += v.version;
            return absl::OkStatus();
          })
      .IgnoreError();  // the visitors never fail
  CaptureTables(store.tables(), &image);
  CheckpointEnd* end = record.mutable_end();
  end->set_tensors(image.tensors);
  end->set_slices(image.slices);
  end->set_tables(image.tables);
  end->set_rows(image.rows);
  AddRecord(record, &image);
  return image;
}

absl::StatusOr<CheckpointInfo> WriteCheckpoint(const CheckpointImage& image,
                                               absl::string_view dir,
                                               Clock* clock, FileSystem* fs) {
  const absl::Time start = clock->Now();
  const std::string path =
      CheckpointPath(dir, image.shard_index, image.num_shards);
  CheckpointInfo info;
  info.set_path(path);
  info.set_unix_time_ms(absl::ToUnixMillis(image.taken));
  info.set_tensors(image.tensors);
  info.set_slices(static_cast<int32_t>(image.slices));
  info.set_workers(image.workers);
  info.set_slice_updates(image.slice_updates);
  info.set_tables(image.tables);
  info.set_rows(static_cast<uint64_t>(image.rows));
  info.set_pause_ms(absl::ToDoubleMilliseconds(image.pause));
  absl::StatusOr<uint64_t> bytes =
      WriteRecordFile(path, kCheckpointFormat, image.records, fs);
  if (!bytes.ok()) return bytes.status();
  info.set_bytes(*bytes);
  info.set_duration_ms(absl::ToDoubleMilliseconds(clock->Now() - start));
  return info;
}

absl::StatusOr<RestoredCheckpoint> RestoreCheckpoint(
    const std::string& path, ShardStore* store,
    const RestoreCheckpointOptions& options) {
  const absl::Time start = absl::Now();
  const std::function<void(uint64_t)>& progress = options.progress;
  const absl::Duration progress_every = options.progress_every;
  absl::Time next_report = start + progress_every;
  uint64_t bytes_read = 0;
  if (store->Size().tensors != 0 || store->tables().totals().tables != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot restore checkpoint ", path,
                     " into a shard holding tensors or tables"));
  }
  Restorer restorer(path, store);
  CheckpointRecord record;
  absl::StatusOr<RecordFileInfo> file = ReadRecordFile(
      path, kCheckpointFormat,
      [&](absl::string_view bytes, int64_t n) {
        bytes_read += bytes.size() + sizeof(uint32_t);  // record and length
        if (progress && absl::Now() >= next_report) {
          progress(bytes_read);
          next_report = absl::Now() + progress_every;
        }
        if (!record.ParseFromArray(bytes.data(),
                                   static_cast<int>(bytes.size()))) {
          return restorer.Corrupt(
              absl::StrCat("record ", n, " does not parse"));
        }
        return restorer.Apply(record, n);
      },
      options.fs);
  if (!file.ok()) return file.status();
  absl::Status s = restorer.Finish();
  if (!s.ok()) return s;

  RestoredCheckpoint out;
  out.identity = restorer.identity();
  CheckpointInfo& info = out.info;
  info.set_path(path);
  info.set_unix_time_ms(restorer.identity().unix_time_ms());
  info.set_bytes(file->bytes);
  info.set_tensors(restorer.tensors());
  info.set_slices(static_cast<int32_t>(restorer.slices()));
  info.set_slice_updates(restorer.slice_updates());
  info.set_tables(restorer.tables());
  info.set_rows(static_cast<uint64_t>(restorer.rows()));
  out.workers = restorer.TakeWorkers();
  info.set_workers(static_cast<int32_t>(out.workers.size()));
  info.set_duration_ms(absl::ToDoubleMilliseconds(absl::Now() - start));
  return out;
}

absl::StatusOr<CheckpointIdentity> ReadCheckpointIdentity(
    const std::string& path, FileSystem* fs) {
  absl::StatusOr<std::string> first =
      ReadFirstRecord(path, kCheckpointFormat, fs);
  if (!first.ok()) return first.status();
  CheckpointRecord record;
  if (!record.ParseFromString(*first) || !record.has_identity()) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint ", path, ": the first record is not the shard identity"));
  }
  return record.identity();
}

}  // namespace asyncps
