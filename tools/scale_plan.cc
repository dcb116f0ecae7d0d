#include "tools/scale_plan.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"

namespace asyncps {

absl::StatusOr<ShardMap> PlanScale(const ShardMap& current, int shards) {
  if (!current.slotted()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the shard count changes live only in a slotted run (ps_server "
        "--num_slots); this one serves the ",
        current.DebugString(), " (psctl reshard changes it on stopped files)"));
  }
  if (shards < 1 || shards > current.num_shards()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shards must be in [1, ", current.num_shards(),
                     "] (the run's shard processes, --servers), got ", shards));
  }
  if (shards > current.num_slots()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shards=", shards, " is more than the run's ",
                     current.num_slots(), " slots"));
  }
  const absl::Span<const uint16_t> owners = current.owners();
  std::vector<int> held(current.num_shards(), 0);
  for (const uint16_t o : owners) ++held[o];
  // Shares: S / M each, one more for the S mod M shards that hold the most
  // now (ties: the lower index), which moves the fewest slots.
  std::vector<int> order(shards);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&held](int a, int b) { return held[a] > held[b]; });
  const int slots = current.num_slots();
  std::vector<int> share(current.num_shards(), 0);
  for (int i = 0; i < shards; ++i) {
    share[order[i]] = slots / shards + (i < slots % shards ? 1 : 0);
  }
  // Sources in shard order, each slot in slot order, fill the destinations
  // in shard order.
  std::vector<uint16_t> next(owners.begin(), owners.end());
  std::vector<int> kept(current.num_shards(), 0);
  int to = 0;
  for (int from = 0; from < current.num_shards(); ++from) {
    for (size_t s = 0; s < next.size(); ++s) {
      if (owners[s] != from) continue;
      if (kept[from] < share[from]) {
        ++kept[from];
        continue;
      }
      while (to < shards && held[to] >= share[to]) ++to;
      next[s] = static_cast<uint16_t>(to);
      ++held[to];
      --held[from];
    }
  }
  return ShardMap::Slotted(current.num_shards(), std::move(next),
                           current.epoch() + 1);
}

}  // namespace asyncps
