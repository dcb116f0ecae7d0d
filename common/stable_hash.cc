#include "common/stable_hash.h"

namespace asyncps {

uint64_t StableHash(absl::string_view s) {
  uint64_t h = 14695981039346656037ull;  // FNV-1a 64-bit offset basis
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace asyncps
