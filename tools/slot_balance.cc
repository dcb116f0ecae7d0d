#include "tools/slot_balance.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace asyncps {

namespace {

// The slot of `from` to move to a shard carrying `gap` less: the one whose
// load is nearest gap / 2 among those below gap; -1 when none is.
int64_t BestSlot(const std::vector<uint16_t>& owners,
                 absl::Span<const uint64_t> load, int from, uint64_t gap) {
  int64_t best = -1;
  uint64_t best_distance = 0;
  const uint64_t half = gap / 2;
  for (size_t s = 0; s < owners.size(); ++s) {
    if (owners[s] != from || load[s] == 0 || load[s] >= gap) continue;
    const uint64_t d = load[s] > half ? load[s] - half : half - load[s];
    if (best < 0 || d < best_distance) {
      best = static_cast<int64_t>(s);
      best_distance = d;
    }
  }
  return best;
}

}  // namespace

double Imbalance(absl::Span<const uint64_t> shard_loads) {
  if (shard_loads.empty()) return 0;
  long double total = 0;
  uint64_t busiest = 0;
  for (const uint64_t l : shard_loads) {
    total += l;
    busiest = std::max(busiest, l);
  }
  if (total == 0) return 0;
  return static_cast<double>(busiest * shard_loads.size() / total);
}

absl::StatusOr<BalancePlan> PlanBalance(const ShardMap& map,
                                        absl::Span<const uint64_t> load,
                                        double threshold, int max_moves) {
  if (!map.slotted()) {
    return absl::InvalidArgumentError(
        "the run serves a static map, which has no slots to move: start it "
        "with --num_slots (or psctl reshard its files with --slots)");
  }
  if (load.size() != static_cast<size_t>(map.num_slots()) ||
      !(threshold >= 1) || max_moves < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PlanBalance: ", load.size(), " loads for ", map.num_slots(),
        " slots, threshold ", threshold, " (>= 1), max_moves ", max_moves));
  }
  std::vector<uint16_t> owners(map.owners().begin(), map.owners().end());
  const std::vector<int>& serving = map.serving_shards();
  BalancePlan plan{
      map, serving, std::vector<uint64_t>(serving.size(), 0), {}, 0, 0, 0};
  // Loads by serving position.
  std::vector<uint64_t> t(serving.size(), 0);
  long double total = 0;
  for (size_t s = 0; s < owners.size(); ++s) {
    t[map.ServingPosition(owners[s])] += load[s];
    total += load[s];
    if (load[s] > plan.hottest_slot_load) {
      plan.hottest_slot_load = load[s];
      plan.hottest_slot = static_cast<uint32_t>(s);
    }
  }
  plan.before = t;
  const long double limit = threshold * total / serving.size();
  while (plan.moved_slots < max_moves) {
    const int b =
        static_cast<int>(std::max_element(t.begin(), t.end()) - t.begin());
    const int d =
        static_cast<int>(std::min_element(t.begin(), t.end()) - t.begin());
    if (t[b] <= limit || b == d) break;
    const int64_t slot = BestSlot(owners, load, serving[b], t[b] - t[d]);
    if (slot < 0) break;
    owners[slot] = static_cast<uint16_t>(serving[d]);
    t[b] -= load[slot];
    t[d] += load[slot];
    ++plan.moved_slots;
  }
  plan.after = std::move(t);
  absl::StatusOr<ShardMap> next =
      ShardMap::Slotted(map.num_shards(), std::move(owners), map.epoch() + 1);
  if (!next.ok()) return next.status();
  plan.map = *std::move(next);
  return plan;
}

}  // namespace asyncps
