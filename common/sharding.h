#ifndef ASYNCPS_COMMON_SHARDING_H_
#define ASYNCPS_COMMON_SHARDING_H_

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

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_SHARDING_H_
