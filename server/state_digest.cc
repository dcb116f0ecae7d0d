#include "server/state_digest.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/stable_hash.h"
#include "proto/checkpoint.pb.h"

namespace asyncps {

namespace {

uint64_t Item(absl::string_view kind, absl::string_view owner,
              absl::string_view bytes) {
  return Mix64(StableHash(absl::StrCat(kind, ":", owner, ":", bytes)));
}

// One hash per row of a batch.
uint64_t RowsDigest(const std::string& table, const CheckpointRows& rows) {
  const size_t n = rows.ids_size();
  if (n == 0) return 0;
  const size_t value_bytes = rows.values().size() / n;
  const size_t state_bytes = rows.optimizer_state().size() / n;
  uint64_t sum = 0;
  for (size_t i = 0; i < n; ++i) {
    std::string row = absl::StrCat(
        rows.ids(i), "/",
        i < static_cast<size_t>(rows.versions_size()) ? rows.versions(i) : 0,
        "/", i < static_cast<size_t>(rows.touched_size()) ? rows.touched(i) : 0,
        "/");
    row.append(rows.values().data() + i * value_bytes, value_bytes);
    row.append(rows.optimizer_state().data() + i * state_bytes, state_bytes);
    sum += Item("row", table, row);
  }
  return sum;
}

}  // namespace

uint64_t StateDigest(const CheckpointImage& image) {
  uint64_t sum = 0;
  std::string tensor, table;
  CheckpointRecord record;
  for (const std::string& bytes : image.records) {
    if (!record.ParseFromString(bytes)) continue;
    switch (record.record_case()) {
      case CheckpointRecord::kTensor:
        tensor = record.tensor().name();
        sum += Item("tensor", "", record.tensor().SerializeAsString());
        break;
      case CheckpointRecord::kSlice:
        sum += Item("slice", tensor, record.slice().SerializeAsString());
        break;
      case CheckpointRecord::kTable:
        table = record.table().name();
        sum += Item("table", "", record.table().SerializeAsString());
        break;
      case CheckpointRecord::kRows:
        sum += RowsDigest(table, record.rows());
        break;
      case CheckpointRecord::kWorker: {
        CheckpointWorker w = record.worker();
        std::vector<uint64_t> applied(w.dedup_applied().begin(),
                                      w.dedup_applied().end());
        std::sort(applied.begin(), applied.end());
        w.clear_dedup_applied();
        for (uint64_t seq : applied) w.add_dedup_applied(seq);
        sum += Item("worker", "", w.SerializeAsString());
        break;
      }
      default:
        break;  // identity (time, build), end (counts)
    }
  }
  return sum;
}

}  // namespace asyncps
