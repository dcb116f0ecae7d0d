#include "common/shard_map.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/stable_hash.h"

namespace asyncps {

ShardMap::ShardMap(int num_shards, uint64_t epoch,
                   std::shared_ptr<const std::vector<uint16_t>> owners)
    : num_shards_(num_shards), epoch_(epoch), owners_(std::move(owners)) {
  std::vector<bool> owns(num_shards, owners_ == nullptr);
  if (owners_ != nullptr) {
    for (const uint16_t owner : *owners_) owns[owner] = true;
  }
  auto serving = std::make_shared<Serving>();
  serving->position.assign(num_shards, -1);
  for (int s = 0; s < num_shards; ++s) {
    if (!owns[s]) continue;
    serving->position[s] = static_cast<int>(serving->shards.size());
    serving->shards.push_back(s);
  }
  serving_ = std::move(serving);
}

absl::StatusOr<ShardMap> ShardMap::Static(int num_shards) {
  if (num_shards < 1 || num_shards > kMaxShards) {
    return absl::InvalidArgumentError(
        absl::StrCat("the number of shards must be in [1, ", kMaxShards,
                     "], got ", num_shards));
  }
  return ShardMap(num_shards, kStaticEpoch);
}

absl::StatusOr<ShardMap> ShardMap::Slotted(int num_shards,
                                           std::vector<uint16_t> owners,
                                           uint64_t epoch) {
  absl::StatusOr<ShardMap> base = Static(num_shards);
  if (!base.ok()) return base.status();
  if (owners.empty() || owners.size() > static_cast<size_t>(kMaxSlots)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the number of slots must be in [1, ", kMaxSlots,
                     "], got ", owners.size()));
  }
  if (epoch == 0) {
    return absl::InvalidArgumentError("a shard map's epoch must be >= 1");
  }
  for (size_t s = 0; s < owners.size(); ++s) {
    if (owners[s] >= num_shards) {
      return absl::InvalidArgumentError(
          absl::StrCat("slot ", s, " is owned by shard ", owners[s],
                       ", but the map has only ", num_shards, " shards"));
    }
  }
  return ShardMap(
      num_shards, epoch,
      std::make_shared<const std::vector<uint16_t>>(std::move(owners)));
}

absl::StatusOr<ShardMap> ShardMap::EvenSlots(int num_shards, int num_slots) {
  if (num_slots < num_shards || num_slots > kMaxSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("the number of slots must be in [number of shards (",
                     num_shards, "), ", kMaxSlots, "], got ", num_slots));
  }
  std::vector<uint16_t> owners(static_cast<size_t>(num_slots));
  for (int s = 0; s < num_slots; ++s) {
    owners[s] = static_cast<uint16_t>(s % std::max(num_shards, 1));
  }
  return Slotted(num_shards, std::move(owners), kStaticEpoch);
}

uint32_t ShardMap::SliceSlot(absl::string_view tensor, uint32_t slice) const {
  const uint64_t n = owners_->size();
  return static_cast<uint32_t>((StableHash(tensor) % n + slice) % n);
}

uint32_t ShardMap::RowSlot(uint64_t table_key, uint64_t id) const {
  return static_cast<uint32_t>(Mix64(id ^ table_key) % owners_->size());
}

int ShardMap::SliceHome(absl::string_view tensor, uint32_t slice) const {
  if (owners_ != nullptr) return (*owners_)[SliceSlot(tensor, slice)];
  const uint64_t n = static_cast<uint64_t>(num_shards_);
  const uint64_t start = StableHash(tensor) % n;
  return static_cast<int>((start + slice) % n);
}

uint32_t ShardMap::SlicesOn(absl::string_view tensor, uint32_t num_slices,
                            int shard) const {
  if (owners_ != nullptr) {
    uint32_t count = 0;
    for (uint32_t i = 0; i < num_slices; ++i) {
      count += SliceHome(tensor, i) == shard ? 1 : 0;
    }
    return count;
  }
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
  if (owners_ != nullptr) return (*owners_)[RowSlot(key.value, id)];
  return static_cast<int>(Mix64(id ^ key.value) %
                          static_cast<uint64_t>(num_shards_));
}

absl::Status ShardMap::CheckRouted(uint64_t routed) const {
  if (routed == 0 || routed == epoch_) return absl::OkStatus();
  if (routed > epoch_) {
    return absl::UnavailableError(
        absl::StrCat("shard serves map epoch ", epoch_,
                     ", the request was routed with ", routed, "; retry"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("the request was routed with shard map epoch ", routed,
                   "; this shard serves the ", DebugString(),
                   ": route it again by the current map"));
}

std::string ShardMap::DebugString() const {
  if (owners_ != nullptr) {
    return absl::StrCat("map of ", owners_->size(), " slots over ", num_shards_,
                        " shard", num_shards_ == 1 ? "" : "s", ", epoch ",
                        epoch_);
  }
  return absl::StrCat("static map of ", num_shards_, " shard",
                      num_shards_ == 1 ? "" : "s", ", epoch ", epoch_);
}

bool OwnsSameSlots(const ShardMap& a, const ShardMap& b, int shard) {
  if (!a.slotted() || !b.slotted()) {
    return !a.slotted() && !b.slotted() && a.num_shards() == b.num_shards();
  }
  if (a.num_slots() != b.num_slots()) return false;
  const absl::Span<const uint16_t> x = a.owners(), y = b.owners();
  for (size_t s = 0; s < x.size(); ++s) {
    if ((x[s] == shard) != (y[s] == shard)) return false;
  }
  return true;
}

}  // namespace asyncps
