// Capturing a shard's state as the records of a full checkpoint
// (CaptureCheckpoint, server/checkpoint.h) or of a delta (CaptureDelta,
// server/checkpoint_delta.h).
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/payload.h"
#include "proto/checkpoint.pb.h"
#include "server/checkpoint.h"
#include "server/checkpoint_delta.h"

namespace asyncps {
namespace {

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

// What to capture: everything (since 0), or what changed at or after epoch
// `since` (a delta).
struct Scope {
  uint32_t since = 0;
  bool delta() const { return since > 0; }
};

// Serializes one slice into slice_record (under the slice's lock: the one
// copy) and appends it.
void AddSlice(const ShardStore::SliceView& v, CheckpointRecord* slice_record,
              CheckpointImage* image) {
  CheckpointSlice* slice = slice_record->mutable_slice();
  slice->set_index(v.index);
  slice->set_version(v.version);
  EncodeFloats(v.values.data(), v.values.size(), slice->mutable_values());
  auto* state = slice->mutable_optimizer_state();
  while (state->size() > static_cast<int>(v.optimizer_state.size())) {
    state->RemoveLast();
  }
  while (state->size() < static_cast<int>(v.optimizer_state.size())) {
    state->Add();
  }
  for (size_t i = 0; i < v.optimizer_state.size(); ++i) {
    EncodeFloats(v.optimizer_state[i].data(), v.optimizer_state[i].size(),
                 state->Mutable(i));
  }
  AddRecord(*slice_record, image);
  ++image->slices;
  image->slice_updates += v.version;
}

// Appends a `tensor` record per tensor and its (changed) slices.
void CaptureTensors(const ShardStore& store, Scope scope,
                    CheckpointImage* image) {
  CheckpointRecord record;
  // Kept apart so that its buffers are reused from slice to slice.
  CheckpointRecord slice_record;
  store
      .Export(
          [&](const TensorSpec& spec) {
            *record.mutable_tensor() = spec;
            AddRecord(record, image);
            ++image->tensors;
            return absl::OkStatus();
          },
          [&](const ShardStore::SliceView& v) {
            if (v.changed >= scope.since) AddSlice(v, &slice_record, image);
            return absl::OkStatus();
          })
      .IgnoreError();  // the visitors never fail
}

// Appends a `table` record per sparse table, (in a delta) a `removed`
// record of its evicted ids, and `rows` records of up to kRowsPerRecord
// (changed) rows, each row copied under its partition's lock.
void CaptureTables(const TableStore& tables, Scope scope,
                   CheckpointImage* image) {
  CheckpointRecord record;
  CheckpointRecord rows_record;
  CheckpointRows* rows = rows_record.mutable_rows();
  auto flush = [&] {
    if (rows->ids_size() == 0) return;
    AddRecord(rows_record, image);
    rows->Clear();
  };
  auto table = [&](const TableSpec& spec) {
    flush();
    *record.mutable_table() = spec;
    AddRecord(record, image);
    ++image->tables;
    return absl::OkStatus();
  };
  auto row = [&](const SparseTable::RowView& r) {
    rows->add_ids(r.id);
    rows->add_versions(r.version);
    rows->add_touched(r.touched);
    rows->mutable_values()->append(reinterpret_cast<const char*>(r.values),
                                   r.dim * sizeof(float));
    rows->mutable_optimizer_state()->append(
        reinterpret_cast<const char*>(r.state), r.state_floats * sizeof(float));
    ++image->rows;
    if (rows->ids_size() >= kRowsPerRecord) flush();
    return absl::OkStatus();
  };
  absl::Status s;
  if (!scope.delta()) {
    s = tables.Export(table, row);
  } else {
    s = tables.ExportSince(
        scope.since, table,
        [&](absl::Span<const uint64_t> ids) {
          CheckpointRemovedRows* removed = record.mutable_removed();
          removed->mutable_ids()->Assign(ids.begin(), ids.end());
          AddRecord(record, image);
          image->removed_rows += static_cast<int64_t>(ids.size());
          return absl::OkStatus();
        },
        row);
  }
  s.IgnoreError();  // the visitors never fail
  flush();
}

// The records of a checkpoint (full or delta) after its first one.
void CaptureBody(const ShardStore& store,
                 const std::vector<CheckpointWorker>& workers, Scope scope,
                 CheckpointImage* image) {
  CheckpointRecord record;
  for (const CheckpointWorker& w : workers) {
    *record.mutable_worker() = w;
    AddRecord(record, image);
    ++image->workers;
  }
  CaptureTensors(store, scope, image);
  CaptureTables(store.tables(), scope, image);
  CheckpointEnd* end = record.mutable_end();
  end->set_tensors(image->tensors);
  end->set_slices(image->slices);
  end->set_tables(image->tables);
  end->set_rows(image->rows);
  end->set_removed_rows(image->removed_rows);
  AddRecord(record, image);
}

CheckpointImage StartImage(const ShardStore& store, absl::Time now,
                           absl::string_view build_version,
                           absl::string_view run_id,
                           CheckpointIdentity* identity) {
  CheckpointImage image;
  image.shard_index = store.options().shard_index;
  image.num_shards = store.options().num_shards;
  image.taken = now;
  identity->set_shard_index(image.shard_index);
  identity->set_num_shards(image.num_shards);
  identity->set_unix_time_ms(absl::ToUnixMillis(now));
  identity->set_build_version(std::string(build_version));
  identity->set_run_id(std::string(run_id));
  SetIdentityMap(store.map(), identity);
  return image;
}

}  // namespace

CheckpointImage CaptureCheckpoint(const ShardStore& store,
                                  const std::vector<CheckpointWorker>& workers,
                                  absl::Time now,
                                  absl::string_view build_version,
                                  absl::string_view run_id) {
  CheckpointRecord record;
  CheckpointImage image =
      StartImage(store, now, build_version, run_id, record.mutable_identity());
  AddRecord(record, &image);
  CaptureBody(store, workers, Scope{}, &image);
  return image;
}

CheckpointImage CaptureDelta(const ShardStore& store,
                             const std::vector<CheckpointWorker>& workers,
                             absl::Time now, uint32_t since,
                             const DeltaChain& chain,
                             absl::string_view build_version,
                             absl::string_view run_id) {
  CheckpointRecord record;
  CheckpointDelta* delta = record.mutable_delta();
  CheckpointImage image =
      StartImage(store, now, build_version, run_id, delta->mutable_identity());
  image.delta = true;
  image.delta_sequence = chain.sequence;
  delta->set_sequence(chain.sequence);
  delta->set_base_crc(chain.base_crc);
  delta->set_base_bytes(chain.base_bytes);
  delta->set_base_unix_time_ms(chain.base_unix_time_ms);
  delta->set_previous_crc(chain.previous_crc);
  AddRecord(record, &image);
  // Epoch 0 is "never": a delta always starts at 1 or later.
  CaptureBody(store, workers, Scope{since == 0 ? 1 : since}, &image);
  return image;
}

}  // namespace asyncps
