#include "server/checkpoint_records.h"

#include "absl/status/status.h"
#include "common/payload.h"

namespace asyncps {
namespace {

// Serializes one slice into `record` (under the slice's lock: the one
// copy); its buffers are reused from slice to slice.
void FillSlice(const ShardStore::SliceView& v, CheckpointRecord* record) {
  CheckpointSlice* slice = record->mutable_slice();
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
}

}  // namespace

void CaptureTensorRecords(const ShardStore& store, const RecordScope& scope,
                          RecordSink add) {
  CheckpointRecord record;
  // Kept apart so that its buffers are reused from slice to slice.
  CheckpointRecord slice_record;
  std::string tensor;
  store
      .Export(
          [&](const TensorSpec& spec) {
            tensor = spec.name();
            *record.mutable_tensor() = spec;
            add(record);
            return absl::OkStatus();
          },
          [&](const ShardStore::SliceView& v) {
            if (v.changed < scope.since) return absl::OkStatus();
            if (scope.slice && !scope.slice(tensor, v.index)) {
              return absl::OkStatus();
            }
            FillSlice(v, &slice_record);
            add(slice_record);
            return absl::OkStatus();
          })
      .IgnoreError();  // the visitors never fail
}

void CaptureTableRecords(const TableStore& tables, const RecordScope& scope,
                         RecordSink add) {
  CheckpointRecord record;
  CheckpointRecord rows_record;
  CheckpointRows* rows = rows_record.mutable_rows();
  std::string table_name;
  auto flush = [&] {
    if (rows->ids_size() == 0) return;
    add(rows_record);
    rows->Clear();
  };
  auto table = [&](const TableSpec& spec) {
    flush();
    table_name = spec.name();
    *record.mutable_table() = spec;
    add(record);
    return absl::OkStatus();
  };
  auto row = [&](const SparseTable::RowView& r) {
    if (scope.row && !scope.row(table_name, r.id)) return absl::OkStatus();
    rows->add_ids(r.id);
    rows->add_versions(r.version);
    rows->add_touched(r.touched);
    rows->mutable_values()->append(reinterpret_cast<const char*>(r.values),
                                   r.dim * sizeof(float));
    rows->mutable_optimizer_state()->append(
        reinterpret_cast<const char*>(r.state), r.state_floats * sizeof(float));
    if (rows->ids_size() >= kRowsPerRecord) flush();
    return absl::OkStatus();
  };
  absl::Status s;
  if (scope.since == 0) {
    s = tables.Export(table, row);
  } else {
    s = tables.ExportSince(
        scope.since, table,
        [&](absl::Span<const uint64_t> ids) {
          auto* removed = record.mutable_removed()->mutable_ids();
          removed->Clear();
          for (uint64_t id : ids) {
            if (!scope.row || scope.row(table_name, id)) removed->Add(id);
          }
          add(record);
          return absl::OkStatus();
        },
        row);
  }
  s.IgnoreError();  // the visitors never fail
  flush();
}

std::vector<absl::string_view> SliceStateOf(const CheckpointSlice& slice) {
  return std::vector<absl::string_view>(slice.optimizer_state().begin(),
                                        slice.optimizer_state().end());
}

RowColumns ColumnsOf(const CheckpointRows& rows) {
  return RowColumns{
      absl::MakeConstSpan(rows.ids().data(), rows.ids_size()),
      absl::MakeConstSpan(rows.versions().data(), rows.versions_size()),
      absl::MakeConstSpan(rows.touched().data(), rows.touched_size())};
}

}  // namespace asyncps
