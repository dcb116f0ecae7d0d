#ifndef ASYNCPS_COMMON_STABLE_HASH_H_
#define ASYNCPS_COMMON_STABLE_HASH_H_

// Hashes whose values never change between builds, machines or runs: the
// shard map (common/shard_map.h) places keys by them, and initial values
// (common/initializer.h, common/row_initializer.h) are derived from them,
// so checkpoints written by one build restore under any other.
//
// Example:
//
//   const uint64_t h = StableHash("fc0/w");       // FNV-1a of the bytes
//   const uint64_t k = Mix64(h ^ 42);             // SplitMix64's finalizer

#include <cstdint>

#include "absl/strings/string_view.h"

namespace asyncps {

// The 64-bit FNV-1a hash of the bytes of `s`.
uint64_t StableHash(absl::string_view s);

// SplitMix64's finalizer: a bijective mix of 64 bits, every output bit
// depending on every input bit.
inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_STABLE_HASH_H_
