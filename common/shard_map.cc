#include "common/shard_map.h"

#include "absl/strings/str_cat.h"
#include "common/stable_hash.h"

namespace asyncps {

absl::StatusOr<ShardMap> ShardMap::Static(int num_shards) {
  if (num_shards < 1 || num_shards > kMaxShards) {
    return absl::InvalidArgumentError(
        absl::StrCat("the number of shards must be in [1, ", kMaxShards,
                     "], got ", num_shards));
  }
  return ShardMap(num_shards, kStaticEpoch);
}

int ShardMap::SliceHome(absl::string_view tensor, uint32_t slice) const {
  const uint64_t n = static_cast<uint64_t>(num_shards_);
  const uint64_t start = StableHash(tensor) % n;
  return static_cast<int>((start + slice) % n);
}

uint32_t ShardMap::SlicesOn(absl::string_view tensor, uint32_t num_slices,
                            int shard) const {
  const uint64_t n = static_cast<uint64_t>(num_shards_);
  const uint64_t start = StableHash(tensor) % n;
  // The first slice index the shard owns, then every n-th.
  const uint64_t first = (static_cast<uint64_t>(shard) + n - start) % n;
  if (first >= num_slices) return 0;
  return static_cast<uint32_t>((num_slices - 1 - first) / n + 1);
}

ShardMap::TableKey ShardMap::KeyOf(absl::string_view table) {
  return TableKey{Mix64(StableHash(table))};
}

int ShardMap::RowHome(TableKey key, uint64_t id) const {
  return static_cast<int>(Mix64(id ^ key.value) %
                          static_cast<uint64_t>(num_shards_));
}

absl::Status ShardMap::CheckRouted(uint64_t routed) const {
  if (routed == 0 || routed == epoch_) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("the request was routed with shard map epoch ", routed,
                   "; this shard serves the ", DebugString(),
                   ": route it again by the current map"));
}

std::string ShardMap::DebugString() const {
  return absl::StrCat("static map of ", num_shards_, " shard",
                      num_shards_ == 1 ? "" : "s", ", epoch ", epoch_);
}

}  // namespace asyncps
