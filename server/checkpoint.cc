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
#include "common/shard_map_proto.h"
#include "common/tensor_layout.h"
#include "proto/checkpoint.pb.h"
#include "server/checkpoint_delta.h"
#include "server/checkpoint_restorer.h"
#include "server/record_file.h"

namespace asyncps {
namespace {

// 3: sparse tables; 2: worker records; 1: tensors only.
constexpr uint32_t kFormatVersion = 3;

// Applies the deltas of options.deltas to a store restored from the full
// checkpoint `file` (out holds what it restored), and makes `out` describe
// the state restored: counts, worker records and capture time of the last
// delta applied.
absl::Status ApplyChain(const RecordFileInfo& file,
                        const RestoreCheckpointOptions& options,
                        ShardStore* store, RestoredCheckpoint* out) {
  DeltaBase base;
  base.identity = out->identity;
  base.crc = file.crc;
  base.bytes = file.bytes;
  absl::StatusOr<AppliedDeltas> deltas =
      ApplyDeltas(base, options.deltas, store, options.fs);
  if (!deltas.ok()) return deltas.status();
  CheckpointInfo& info = out->info;
  info.set_deltas_applied(deltas->applied);
  info.set_deltas_ignored(deltas->ignored);
  out->deltas_ignored_reason = deltas->ignored_reason;
  if (deltas->applied == 0) return absl::OkStatus();
  out->workers = std::move(deltas->workers);
  info.set_unix_time_ms(deltas->unix_time_ms);
  info.set_bytes(info.bytes() + deltas->bytes);
  const TableStore::Totals tables = store->tables().totals();
  info.set_tables(tables.tables);
  info.set_rows(tables.rows);
  int32_t tensors = 0, slices = 0;
  uint64_t updates = 0;
  store
      ->Export(
          [&](const TensorSpec&) {
            ++tensors;
            return absl::OkStatus();
          },
          [&](const ShardStore::SliceView& v) {
            ++slices;
            updates += v.version;
            return absl::OkStatus();
          })
      .IgnoreError();  // the visitors never fail
  info.set_tensors(tensors);
  info.set_slices(slices);
  info.set_slice_updates(updates);
  return absl::OkStatus();
}

}  // namespace

std::string CheckpointPath(absl::string_view dir, int shard_index,
                           int num_shards) {
  return ShardFilePath(dir, shard_index, num_shards, "ckpt");
}

const RecordFileFormat kCheckpointFormat = {
    /*magic=*/absl::string_view("APSCKPT\n", 8), /*version=*/kFormatVersion,
    /*oldest_readable=*/1, /*what=*/"checkpoint"};

absl::StatusOr<CheckpointInfo> WriteCheckpoint(const CheckpointImage& image,
                                               absl::string_view dir,
                                               Clock* clock, FileSystem* fs,
                                               uint32_t* crc) {
  const absl::Time start = clock->Now();
  const std::string path =
      image.delta ? DeltaPath(dir, image.shard_index, image.num_shards,
                              image.delta_sequence)
                  : CheckpointPath(dir, image.shard_index, image.num_shards);
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
  info.set_delta(image.delta);
  info.set_delta_sequence(image.delta_sequence);
  info.set_removed_rows(static_cast<uint64_t>(image.removed_rows));
  absl::StatusOr<uint64_t> bytes =
      WriteRecordFile(path, image.delta ? kDeltaFormat : kCheckpointFormat,
                      image.records, fs, crc);
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
  CheckpointRestorer restorer(path, store, /*delta=*/false);
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
  if (!options.deltas.empty()) {
    absl::Status applied = ApplyChain(*file, options, store, &out);
    if (!applied.ok()) return applied;
  }
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

void SetIdentityMap(const ShardMap& map, CheckpointIdentity* identity) {
  if (map.slotted()) {
    ShardMapToProto(map, identity->mutable_map());
  } else {
    identity->clear_map();
  }
}

absl::StatusOr<ShardMap> IdentityMap(const CheckpointIdentity& identity) {
  return ShardMapOr(identity.map(), identity.num_shards());
}

bool MapRestoresInto(const ShardMap& written, const ShardMap& serving) {
  if (written == serving) return true;
  if (written.slotted() || !serving.slotted() ||
      written.num_shards() != serving.num_shards() ||
      serving.num_slots() % serving.num_shards() != 0) {
    return false;
  }
  const absl::Span<const uint16_t> owners = serving.owners();
  for (size_t s = 0; s < owners.size(); ++s) {
    if (owners[s] != s % static_cast<size_t>(serving.num_shards())) {
      return false;
    }
  }
  return true;
}

}  // namespace asyncps
