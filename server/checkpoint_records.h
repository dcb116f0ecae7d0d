#ifndef ASYNCPS_SERVER_CHECKPOINT_RECORDS_H_
#define ASYNCPS_SERVER_CHECKPOINT_RECORDS_H_

// A shard's tensors and tables as CheckpointRecords (proto/checkpoint.proto):
// the body of checkpoint files (server/checkpoint.h, checkpoint_delta.h) and
// the state a live slot move copies (server/slot_state.h). Capture walks the
// store and hands out one record at a time; the caller serializes or counts
// it. The readers of both turn records back into what the store takes.
//
// Example:
//
//   RecordScope scope;                       // everything
//   scope.since = epoch;                     // or: what changed since
//   CaptureTensorRecords(store, scope, [&](const CheckpointRecord& r) {
//     out.push_back(r.SerializeAsString());  // tensor, then its slices
//   });
//   CaptureTableRecords(store.tables(), scope, add);  // table, removed, rows

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/checkpoint.pb.h"
#include "store/shard_store.h"
#include "store/table_store.h"

namespace asyncps {

// Rows of a sparse table per `rows` record (a few MiB for common dims).
inline constexpr int kRowsPerRecord = 4096;

// Which slices and rows a capture takes.
struct RecordScope {
  // 0: all of them; else those changed at or after this change epoch
  // (store/change_epoch.h), and the tables' `removed` records of rows
  // evicted at or after it.
  uint32_t since = 0;
  // When set, only the slices / rows (and removed ids) it accepts.
  std::function<bool(const std::string& tensor, uint32_t index)> slice;
  std::function<bool(const std::string& table, uint64_t id)> row;
};

using RecordSink = absl::FunctionRef<void(const CheckpointRecord&)>;

// A `tensor` record per tensor (its spec with its schedule), each followed
// by a `slice` record per local slice in scope (each copied under its lock).
void CaptureTensorRecords(const ShardStore& store, const RecordScope& scope,
                          RecordSink add);

// A `table` record per sparse table; with scope.since > 0 then a `removed`
// record of its ids evicted since (possibly none); then `rows` records of
// up to kRowsPerRecord rows in scope (each row copied under its
// partition's lock).
void CaptureTableRecords(const TableStore& tables, const RecordScope& scope,
                         RecordSink add);

// The optimizer state buffers of a slice record, as the store takes them.
std::vector<absl::string_view> SliceStateOf(const CheckpointSlice& slice);

// The columns of a rows record, as the store takes them.
struct RowColumns {
  absl::Span<const uint64_t> ids;
  absl::Span<const uint64_t> versions;
  absl::Span<const int64_t> touched;
};
RowColumns ColumnsOf(const CheckpointRows& rows);

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_CHECKPOINT_RECORDS_H_
