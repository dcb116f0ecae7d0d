#include "server/checkpoint_delta.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/checkpoint_restorer.h"

namespace asyncps {
namespace {

// Why the delta whose records are `records` (read intact from `path`) does
// not continue the chain of `base` as delta `sequence` after a delta of
// body CRC `previous_crc`; empty when it does.
std::string ChainMismatch(const std::vector<std::string>& records,
                          const DeltaBase& base, uint64_t sequence,
                          uint32_t previous_crc, const std::string& path) {
  CheckpointRecord first;
  if (records.empty() || !first.ParseFromString(records[0]) ||
      !first.has_delta()) {
    return absl::StrCat("checkpoint delta ", path,
                        ": the first record is not the delta header");
  }
  const CheckpointDelta& d = first.delta();
  const CheckpointIdentity& id = d.identity();
  if (id.shard_index() != base.identity.shard_index() ||
      id.num_shards() != base.identity.num_shards() ||
      id.run_id() != base.identity.run_id()) {
    return absl::StrCat("checkpoint delta ", path, " belongs to shard ",
                        id.shard_index(), " of ", id.num_shards(), " of run '",
                        id.run_id(), "', not to the full checkpoint's");
  }
  if (d.sequence() != sequence) {
    return absl::StrCat("checkpoint delta ", path, " is delta ", d.sequence(),
                        " of its chain; delta ", sequence, " is missing");
  }
  if (d.base_crc() != base.crc || d.base_bytes() != base.bytes ||
      d.base_unix_time_ms() != base.identity.unix_time_ms()) {
    return absl::StrFormat(
        "checkpoint delta %s follows another full checkpoint (crc %08x, %d "
        "bytes) than the one restored (crc %08x, %d bytes)",
        path, d.base_crc(), d.base_bytes(), base.crc, base.bytes);
  }
  if (d.previous_crc() != previous_crc) {
    return absl::StrFormat(
        "checkpoint delta %s follows another delta %d (crc %08x) than the one "
        "restored (crc %08x)",
        path, sequence - 1, d.previous_crc(), previous_crc);
  }
  return "";
}

// Applies the records of an intact delta that continues the chain.
absl::Status ApplyRecords(const std::vector<std::string>& records,
                          CheckpointRestorer* restorer) {
  CheckpointRecord record;
  for (size_t n = 0; n < records.size(); ++n) {
    if (!record.ParseFromString(records[n])) {
      return restorer->Corrupt(absl::StrCat("record ", n, " does not parse"));
    }
    absl::Status s = restorer->Apply(record, static_cast<int64_t>(n));
    if (!s.ok()) return s;
  }
  return restorer->Finish();
}

}  // namespace

const RecordFileFormat kDeltaFormat = {
    /*magic=*/absl::string_view("APSDELT\n", 8), /*version=*/1,
    /*oldest_readable=*/1, /*what=*/"checkpoint delta"};

std::string DeltaPath(absl::string_view dir, int shard_index, int num_shards,
                      uint64_t sequence) {
  return ShardFilePath(dir, shard_index, num_shards,
                       absl::StrCat("delta-", sequence));
}

absl::StatusOr<AppliedDeltas> ApplyDeltas(const DeltaBase& base,
                                          const std::vector<std::string>& paths,
                                          ShardStore* store, FileSystem* fs) {
  AppliedDeltas out;
  uint32_t previous_crc = 0;
  for (size_t i = 0; i < paths.size(); ++i) {
    const std::string& path = paths[i];
    // Read whole and checked before anything is applied: a torn delta
    // leaves the store as the deltas before it made it.
    std::vector<std::string> records;
    absl::StatusOr<RecordFileInfo> file = ReadRecordFile(
        path, kDeltaFormat,
        [&records](absl::string_view bytes, int64_t) {
          records.emplace_back(bytes);
          return absl::OkStatus();
        },
        fs);
    std::string why;
    if (absl::IsDataLoss(file.status())) {
      why = std::string(file.status().message());
    } else if (!file.ok()) {
      return file.status();
    } else {
      why = ChainMismatch(records, base, i + 1, previous_crc, path);
    }
    if (!why.empty()) {
      out.ignored = static_cast<int>(paths.size() - i);
      out.ignored_reason = std::move(why);
      break;
    }
    CheckpointRestorer restorer(path, store, /*delta=*/true);
    absl::Status s = ApplyRecords(records, &restorer);
    if (!s.ok()) return s;
    ++out.applied;
    previous_crc = file->crc;
    out.bytes += file->bytes;
    out.workers = restorer.TakeWorkers();
    out.unix_time_ms = restorer.identity().unix_time_ms();
  }
  return out;
}

}  // namespace asyncps
