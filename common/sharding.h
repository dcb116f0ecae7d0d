#ifndef ASYNCPS_COMMON_SHARDING_H_
#define ASYNCPS_COMMON_SHARDING_H_

// Where a parameter lives, as pure functions of names, ids and the shard
// count: SliceHome for a slice of a dense tensor, RowHome for a row of a
// sparse table. Workers and shards compute the same answers without any
// metadata service, so a worker sends each slice and row straight to its
// shard, and a shard refuses those that are not its own.
//
// Example:
//
//   // Slice i of tensor "w" goes to shard SliceHome("w", i, num_shards);
//   // shard 0 holds this many of its slices:
//   const uint32_t on_0 = LocalSliceCount("w", num_slices, 0, num_shards);
//
//   // The ids of a pull of table "emb", split by shard.
//   std::vector<std::vector<uint64_t>> by_shard(num_shards);
//   const uint64_t key = RowTableKey("emb");  // once per table
//   for (uint64_t id : ids) {
//     by_shard[RowHomeOf(key, id, num_shards)].push_back(id);
//   }

#include <cstdint>

#include "absl/strings/string_view.h"

namespace asyncps {

// The home shard of slice `slice` of tensor `tensor` in a cluster of
// `num_shards` shards. A pure function, so workers and servers agree
// without any metadata service.
//
// Slices of one tensor go round-robin over the shards, starting at a shard
// chosen by a stable hash (FNV-1a) of the tensor name: a large tensor spreads
// evenly, and many small tensors start on different shards.
// REQUIRES: num_shards > 0.
int SliceHome(absl::string_view tensor, uint32_t slice, int num_shards);

// How many of the first `num_slices` slices of `tensor` live on `shard`
// (closed form of counting SliceHome(tensor, i, num_shards) == shard).
uint32_t LocalSliceCount(absl::string_view tensor, uint32_t num_slices,
                         int shard, int num_shards);

// The stable 64-bit FNV-1a hash used above (exposed for tests).
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

// The home shard of row `id` of sparse table `table`: a hash of (table,
// id) modulo num_shards, so rows spread evenly whatever their ids (dense
// ranges, hashed features, Zipf-distributed ones). A pure function, like
// SliceHome. REQUIRES: num_shards > 0.
int RowHome(absl::string_view table, uint64_t id, int num_shards);

// The same from the table's precomputed RowTableKey, for loops over ids.
uint64_t RowTableKey(absl::string_view table);
inline int RowHomeOf(uint64_t table_key, uint64_t id, int num_shards) {
  return static_cast<int>(Mix64(id ^ table_key) %
                          static_cast<uint64_t>(num_shards));
}

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_SHARDING_H_
