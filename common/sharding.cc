#include "common/sharding.h"

namespace asyncps {

uint64_t StableHash(absl::string_view s) {
  uint64_t h = 14695981039346656037ull;  // FNV-1a 64-bit offset basis
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

int SliceHome(absl::string_view tensor, uint32_t slice, int num_shards) {
  const uint64_t start = StableHash(tensor) % static_cast<uint64_t>(num_shards);
  return static_cast<int>((start + slice) % static_cast<uint64_t>(num_shards));
}

uint64_t RowTableKey(absl::string_view table) {
  return Mix64(StableHash(table));
}

int RowHome(absl::string_view table, uint64_t id, int num_shards) {
  return RowHomeOf(RowTableKey(table), id, num_shards);
}

uint32_t LocalSliceCount(absl::string_view tensor, uint32_t num_slices,
                         int shard, int num_shards) {
  const uint64_t n = static_cast<uint64_t>(num_shards);
  const uint64_t start = StableHash(tensor) % n;
  // The first local slice index, then every n-th.
  const uint64_t first = (static_cast<uint64_t>(shard) + n - start) % n;
  if (first >= num_slices) return 0;
  return static_cast<uint32_t>((num_slices - 1 - first) / n + 1);
}

}  // namespace asyncps
