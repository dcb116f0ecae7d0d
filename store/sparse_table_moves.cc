// The rows of slots that move between shards (live slot moves,
// proto/slot_moves.proto): importing them ahead of owning them, and
// following a change of the map served.
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "store/sparse_table.h"

namespace asyncps {

absl::Status SparseTable::Import(uint64_t id, uint64_t version, int64_t touched,
                                 const float* values, const float* state,
                                 bool* created) {
  const ShardMap map = map_->get();
  if (map.RowHome(table_key_, id) == shard_index_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "row ", id, " of table ", QuoteName(spec_.name()),
        " lives on this shard (", shard_index_, ") under the ",
        map.DebugString(), ": only rows of other shards' slots are imported"));
  }
  return Put(id, version, touched, values, state, /*replace=*/true, created);
}

uint64_t SparseTable::AdoptMap(const ShardMap& prev, const ShardMap& next) {
  const uint32_t now = Now();
  uint64_t dropped = 0;
  std::vector<uint64_t> leaving;
  for (int k = 0; k < kPartitions; ++k) {
    Partition& p = partitions_[k];
    absl::MutexLock l(&p.mu);
    leaving.clear();
    for (const Slot& s : p.slots) {
      if (s.row1 == 0) continue;
      const bool was = prev.RowHome(table_key_, s.id) == shard_index_;
      const bool is = next.RowHome(table_key_, s.id) == shard_index_;
      if (was && !is) {
        leaving.push_back(s.id);
      } else if (!was && is) {
        Stamp(p, s.row1 - 1, now);
      }
    }
    // Erased after the walk: erasing moves other slots of the index.
    for (uint64_t id : leaving) EraseRow(p, id);
    dropped += leaving.size();
  }
  return dropped;
}

}  // namespace asyncps
