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

}  // namespace asyncps
