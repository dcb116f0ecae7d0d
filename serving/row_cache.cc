#include "serving/row_cache.h"

#include <cstring>

#include "absl/container/flat_hash_set.h"

namespace asyncps {

absl::Status RowCache::Advance(uint64_t snapshot_id) {
  for (auto& [name, t] : tables_) {
    std::vector<uint64_t> hot;
    for (size_t r = 0; r < t.ids.size(); ++r) {
      if (t.used[r]) hot.push_back(t.ids[r]);
    }
    std::vector<float> values(hot.size() * t.dim);
    if (!hot.empty()) {
      absl::Status s = source_->ReadRows(name, hot, values.data());
      if (!s.ok()) return s;
    }
    stats_.refreshed += hot.size();
    t.slot.clear();
    for (size_t r = 0; r < hot.size(); ++r) t.slot[hot[r]] = r;
    t.ids = std::move(hot);
    t.values = std::move(values);
    t.used.assign(t.ids.size(), false);
  }
  snapshot_ = snapshot_id;
  return absl::OkStatus();
}

absl::Status RowCache::Lookup(uint64_t snapshot_id, const std::string& table,
                              int dim, absl::Span<const uint64_t> ids,
                              float* out) {
  absl::MutexLock l(&mu_);
  if (snapshot_id > snapshot_) {
    absl::Status s = Advance(snapshot_id);
    if (!s.ok()) return s;
  }
  Table& t = tables_[table];
  if (t.dim != dim) {
    t = Table();
    t.dim = dim;
  }
  std::vector<uint64_t> missing;
  absl::flat_hash_set<uint64_t> seen;
  for (uint64_t id : ids) {
    if (!t.slot.contains(id) && seen.insert(id).second) missing.push_back(id);
  }
  if (!missing.empty()) {
    std::vector<float> values(missing.size() * dim);
    absl::Status s = source_->ReadRows(table, missing, values.data());
    if (!s.ok()) return s;
    stats_.misses += missing.size();
    // Full: start over with this batch's rows (the next snapshot keeps
    // only what is used).
    if (t.ids.size() + missing.size() > capacity_) {
      t.slot.clear();
      t.ids.clear();
      t.values.clear();
      t.used.clear();
    }
    for (size_t k = 0; k < missing.size(); ++k) {
      t.slot[missing[k]] = t.ids.size();
      t.ids.push_back(missing[k]);
      t.values.insert(t.values.end(), values.begin() + k * dim,
                      values.begin() + (k + 1) * dim);
      t.used.push_back(false);
    }
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    auto it = t.slot.find(ids[i]);
    if (it == t.slot.end()) {
      // More distinct ids in one batch than the cache holds: read again.
      absl::Status s =
          source_->ReadRows(table, ids.subspan(i, 1), out + i * dim);
      if (!s.ok()) return s;
      continue;
    }
    std::memcpy(out + i * dim,
                t.values.data() + it->second * static_cast<size_t>(dim),
                dim * sizeof(float));
    t.used[it->second] = true;
  }
  stats_.hits += ids.size() - missing.size();
  return absl::OkStatus();
}

RowCache::Stats RowCache::stats() const {
  absl::MutexLock l(&mu_);
  return stats_;
}

}  // namespace asyncps
