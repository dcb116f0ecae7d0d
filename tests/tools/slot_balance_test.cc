// Planning a rebalance: the busiest shard ends within the threshold when
// slots allow it (Zipf(1.2) row ids over 4096 slots and 4 shards: the
// CTR model's case), nothing moves when the load is even, a slot hotter
// than the mean is reported and not bounced around, bad input is refused.
#include "tools/slot_balance.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "common/shard_map.h"
#include "common/stable_hash.h"

namespace asyncps {
namespace {

uint64_t Sum(const std::vector<uint64_t>& v) {
  uint64_t s = 0;
  for (uint64_t x : v) s += x;
  return s;
}

TEST_CASE("Zipf(1.2) rows on 4 shards: busiest / mean ends within 1.10") {
  const ShardMap map = *ShardMap::EvenSlots(4, 4096);
  std::vector<uint64_t> load(4096, 0);
  const ShardMap::TableKey key = ShardMap::KeyOf("ctr/emb0");
  for (uint64_t rank = 1; rank <= 1000000; ++rank) {
    // Pushes of the id of this rank: proportional to rank^-1.2.
    const uint64_t pushes =
        static_cast<uint64_t>(1e7 / std::pow(static_cast<double>(rank), 1.2));
    load[map.RowSlot(key.value, Mix64(rank))] += pushes * 64;
  }
  absl::StatusOr<BalancePlan> plan = PlanBalance(map, load, 1.05, 4096);
  REQUIRE(plan.ok());
  CHECK(Imbalance(plan->before) > 1.10);
  CHECK(Imbalance(plan->after) <= 1.10);
  CHECK(Sum(plan->after) == Sum(plan->before));
  CHECK(plan->moved_slots > 0);
  CHECK(plan->map.epoch() == map.epoch() + 1);
  // The plan's loads are what the new map gives.
  std::vector<uint64_t> recount(4, 0);
  for (int s = 0; s < 4096; ++s) recount[plan->map.owners()[s]] += load[s];
  CHECK(recount == plan->after);
}

TEST_CASE("slots move only among the shards that own slots") {
  // 4 shards declared, slots on 0 and 2; 1 and 3 stand by (or have no
  // process yet): a rebalance never gives them slots.
  std::vector<uint16_t> owners(16);
  for (size_t s = 0; s < owners.size(); ++s) owners[s] = s < 12 ? 0 : 2;
  const ShardMap map = *ShardMap::Slotted(4, owners, 3);
  const std::vector<uint64_t> load(16, 10);
  absl::StatusOr<BalancePlan> plan = PlanBalance(map, load, 1.0, 100);
  REQUIRE(plan.ok());
  CHECK(plan->shards == std::vector<int>{0, 2});
  CHECK(plan->before == std::vector<uint64_t>{120, 40});
  CHECK(plan->after == std::vector<uint64_t>{80, 80});
  CHECK(plan->moved_slots == 4);
  CHECK(plan->map.serving_shards() == std::vector<int>{0, 2});
  CHECK(Imbalance(plan->before) == 1.5);
  CHECK(Imbalance(plan->after) == 1.0);
}

TEST_CASE("an even load moves nothing") {
  const ShardMap map = *ShardMap::EvenSlots(3, 30);
  const std::vector<uint64_t> load(30, 7);
  absl::StatusOr<BalancePlan> plan = PlanBalance(map, load, 1.0, 100);
  REQUIRE(plan.ok());
  CHECK(plan->moved_slots == 0);
  CHECK(plan->map.owners() == map.owners());
  CHECK(Imbalance(plan->after) == 1.0);
}

TEST_CASE("a slot hotter than the mean stays and is reported") {
  const ShardMap map = *ShardMap::EvenSlots(2, 4);  // slots 0, 2 on shard 0
  const std::vector<uint64_t> load = {1000, 10, 5, 10};
  absl::StatusOr<BalancePlan> plan = PlanBalance(map, load, 1.0, 100);
  REQUIRE(plan.ok());
  CHECK(plan->hottest_slot == 0);
  CHECK(plan->hottest_slot_load == 1000);
  CHECK(plan->map.owners()[0] == 0);
  // Slot 2 joins shard 1: the busiest shard can only shed it.
  CHECK(plan->after == std::vector<uint64_t>{1000, 25});
  CHECK(plan->moved_slots == 1);
}

TEST_CASE("max_moves bounds the plan; bad input is refused") {
  const ShardMap map = *ShardMap::EvenSlots(2, 8);
  const std::vector<uint64_t> load = {9, 1, 9, 1, 9, 1, 9, 1};
  absl::StatusOr<BalancePlan> plan = PlanBalance(map, load, 1.0, 1);
  REQUIRE(plan.ok());
  CHECK(plan->moved_slots == 1);
  CHECK(absl::IsInvalidArgument(
      PlanBalance(*ShardMap::Static(2), {}, 1.05, 10).status()));
  CHECK(absl::IsInvalidArgument(PlanBalance(map, {1, 2}, 1.05, 10).status()));
  CHECK(absl::IsInvalidArgument(PlanBalance(map, load, 0.9, 10).status()));
  CHECK(absl::IsInvalidArgument(PlanBalance(map, load, 1.05, -1).status()));
  CHECK(Imbalance({}) == 0);
  CHECK(Imbalance({0, 0}) == 0);
  CHECK(Imbalance({3, 1}) == 1.5);
}

}  // namespace
}  // namespace asyncps
