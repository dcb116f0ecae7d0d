// Capturing a shard's state as the records of a full checkpoint
// (CaptureCheckpoint, server/checkpoint.h) or of a delta (CaptureDelta,
// server/checkpoint_delta.h).
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/checkpoint.pb.h"
#include "server/checkpoint.h"
#include "server/checkpoint_delta.h"
#include "server/checkpoint_records.h"

namespace asyncps {
namespace {

constexpr size_t kLengthBytes = 4;

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
};

// Appends a captured tensor, slice, table, removed or rows record, counting
// it in the image.
void AddCounted(const CheckpointRecord& record, CheckpointImage* image) {
  AddRecord(record, image);
  switch (record.record_case()) {
    case CheckpointRecord::kTensor:
      ++image->tensors;
      break;
    case CheckpointRecord::kSlice:
      ++image->slices;
      image->slice_updates += record.slice().version();
      break;
    case CheckpointRecord::kTable:
      ++image->tables;
      break;
    case CheckpointRecord::kRows:
      image->rows += record.rows().ids_size();
      break;
    case CheckpointRecord::kRemoved:
      image->removed_rows += record.removed().ids_size();
      break;
    default:
      break;
  }
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
  RecordScope records;
  records.since = scope.since;
  auto add = [image](const CheckpointRecord& r) { AddCounted(r, image); };
  CaptureTensorRecords(store, records, add);
  CaptureTableRecords(store.tables(), records, add);
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
