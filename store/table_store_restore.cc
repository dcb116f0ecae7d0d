// Restoring a shard's tables from checkpoints (tables, rows, a delta's
// removals) and importing the rows of slots that move here (live slot
// moves, proto/slot_moves.proto), then following the map served.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "common/payload.h"
#include "store/spec_diff.h"
#include "store/table_store.h"

namespace asyncps {

absl::Status TableStore::RemoveRows(absl::string_view table,
                                    absl::Span<const uint64_t> ids) {
  SparseTable* t = FindMutable(table);
  if (t == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("removed rows of unknown table ", QuoteName(table)));
  }
  uint64_t removed = 0;
  for (uint64_t id : ids) removed += t->Remove(id);
  options_.release(removed * t->row_bytes());
  return absl::OkStatus();
}

absl::Status TableStore::RestoreTable(const TableSpec& listed) {
  const Unlisted<TableSpec> in = Unlist(listed);
  const TableSpec& spec = in.spec;
  absl::Status s = SparseTable::ValidateSpec(spec);
  if (!s.ok()) return s;
  if (Contains(spec.name())) {
    return absl::FailedPreconditionError(
        absl::StrCat("table ", QuoteName(spec.name()), " exists already"));
  }
  auto table = std::make_unique<SparseTable>(spec, options_.shard_index,
                                             options_.map, options_.epoch,
                                             options_.track_removed_rows);
  s = options_.reserve(table->fixed_bytes(),
                       absl::StrCat("table ", QuoteName(spec.name())));
  if (!s.ok()) return s;
  if (in.rate.has_value()) {
    s = table->schedule().Check(spec.name(), *in.rate);
    if (!s.ok()) {
      options_.release(table->fixed_bytes());
      return s;
    }
    table->schedule().Apply(*in.rate);
  }
  absl::MutexLock l(&mu_);
  tables_.emplace(spec.name(), std::move(table));
  return absl::OkStatus();
}

absl::Status TableStore::RestoreRows(absl::string_view table,
                                     absl::Span<const uint64_t> ids,
                                     absl::Span<const uint64_t> versions,
                                     absl::Span<const int64_t> touched,
                                     absl::string_view values,
                                     absl::string_view state, bool replace) {
  return PutRows(table, ids, versions, touched, values, state,
                 replace ? PutMode::kReplace : PutMode::kRestore);
}

absl::Status TableStore::ImportRows(absl::string_view table,
                                    absl::Span<const uint64_t> ids,
                                    absl::Span<const uint64_t> versions,
                                    absl::Span<const int64_t> touched,
                                    absl::string_view values,
                                    absl::string_view state) {
  return PutRows(table, ids, versions, touched, values, state,
                 PutMode::kImport);
}

absl::Status TableStore::PutRows(absl::string_view table,
                                 absl::Span<const uint64_t> ids,
                                 absl::Span<const uint64_t> versions,
                                 absl::Span<const int64_t> touched,
                                 absl::string_view values,
                                 absl::string_view state, PutMode mode) {
  SparseTable* t = FindMutable(table);
  if (t == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("rows of unknown table ", QuoteName(table)));
  }
  const size_t n = ids.size();
  const size_t value_bytes = n * t->dim() * sizeof(float);
  const size_t state_bytes = n * t->state_floats() * sizeof(float);
  if (versions.size() != n || touched.size() != n ||
      values.size() != value_bytes || state.size() != state_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rows of table ", QuoteName(table), ": ", n, " ids, ", versions.size(),
        " versions, ", touched.size(), " clocks, ", values.size(),
        " bytes of values (need ", value_bytes, ") and ", state.size(),
        " bytes of optimizer state (need ", state_bytes, ")"));
  }
  // Replaced rows hold their bytes already.
  size_t fresh = n;
  if (mode != PutMode::kRestore) {
    fresh = 0;
    for (uint64_t id : ids) fresh += !t->Contains(id);
  }
  absl::Status s = options_.reserve(
      fresh * t->row_bytes(),
      absl::StrCat(fresh, " rows of table ", QuoteName(table)));
  if (!s.ok()) return s;
  uint64_t unused = fresh * t->row_bytes();
  std::vector<float> v(t->dim()), st(t->state_floats());
  for (size_t i = 0; i < n; ++i) {
    DecodeFloats(values.substr(i * t->dim() * sizeof(float)), v.data(),
                 v.size());
    DecodeFloats(state.substr(i * t->state_floats() * sizeof(float)), st.data(),
                 st.size());
    bool created = false;
    s = mode == PutMode::kImport
            ? t->Import(ids[i], versions[i], touched[i], v.data(), st.data(),
                        &created)
            : t->Restore(ids[i], versions[i], touched[i], v.data(), st.data(),
                         mode == PutMode::kReplace, &created);
    if (!s.ok()) break;
    if (created) unused -= std::min<uint64_t>(unused, t->row_bytes());
  }
  if (unused > 0) options_.release(unused);
  return s;
}

uint64_t TableStore::AdoptMap(const ShardMap& prev, const ShardMap& next) {
  uint64_t dropped = 0;
  for (SparseTable* t : Sorted()) {
    uint64_t n;
    {
      // No request is between finding its rows and using them.
      absl::MutexLock evict(&evict_mu_);
      n = t->AdoptMap(prev, next);
    }
    options_.release(n * t->row_bytes());
    dropped += n;
  }
  return dropped;
}

}  // namespace asyncps
