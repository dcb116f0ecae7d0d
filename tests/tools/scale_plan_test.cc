// Planning psctl scale: the slots end on shards 0..M-1 in shares that
// differ by at most one, a shard keeps what it may keep (the fewest slots
// move), a shard being drained empties into as few destinations as the
// shares allow, and bad input is refused.
#include "tools/scale_plan.h"

#include <catch2/catch.hpp>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "common/shard_map.h"

namespace asyncps {
namespace {

std::vector<int> Held(const ShardMap& map) {
  std::vector<int> held(map.num_shards(), 0);
  for (const uint16_t o : map.owners()) ++held[o];
  return held;
}

int Moved(const ShardMap& a, const ShardMap& b) {
  int moved = 0;
  for (int s = 0; s < a.num_slots(); ++s) {
    moved += a.owners()[s] != b.owners()[s] ? 1 : 0;
  }
  return moved;
}

// The (source, destination) pairs a change moves slots between.
std::set<std::pair<int, int>> Pairs(const ShardMap& a, const ShardMap& b) {
  std::set<std::pair<int, int>> pairs;
  for (int s = 0; s < a.num_slots(); ++s) {
    if (a.owners()[s] != b.owners()[s]) {
      pairs.insert({a.owners()[s], b.owners()[s]});
    }
  }
  return pairs;
}

// The slotted map of 4 processes, 64 slots, on the first `serving` shards.
ShardMap Serving(int serving, uint64_t epoch) {
  std::vector<uint16_t> owners(64);
  for (size_t s = 0; s < owners.size(); ++s) owners[s] = s % serving;
  return *ShardMap::Slotted(4, owners, epoch);
}

TEST_CASE("2 -> 3 -> 4 -> 2 shards: even shares, fewest slots moved") {
  const ShardMap two = Serving(2, 1);
  const absl::StatusOr<ShardMap> three = PlanScale(two, 3);
  REQUIRE(three.ok());
  CHECK(three->epoch() == 2);
  CHECK(Held(*three) == std::vector<int>{22, 21, 21, 0});
  CHECK(Moved(two, *three) == 21);  // only what shard 2 needs
  CHECK(Pairs(two, *three) == std::set<std::pair<int, int>>{{0, 2}, {1, 2}});

  const absl::StatusOr<ShardMap> four = PlanScale(*three, 4);
  REQUIRE(four.ok());
  CHECK(Held(*four) == std::vector<int>{16, 16, 16, 16});
  CHECK(Moved(*three, *four) == 16);

  const absl::StatusOr<ShardMap> back = PlanScale(*four, 2);
  REQUIRE(back.ok());
  CHECK(Held(*back) == std::vector<int>{32, 32, 0, 0});
  CHECK(Moved(*four, *back) == 32);
  // Shard 2 empties into shard 0, shard 3 into shard 1: two moves.
  CHECK(Pairs(*four, *back) == std::set<std::pair<int, int>>{{2, 0}, {3, 1}});
}

TEST_CASE("scaling to the shards that already hold even shares moves nothing") {
  const ShardMap two = Serving(2, 7);
  const absl::StatusOr<ShardMap> same = PlanScale(two, 2);
  REQUIRE(same.ok());
  CHECK(Moved(two, *same) == 0);
  // An uneven run (after a rebalance) is evened out within the M shards.
  std::vector<uint16_t> owners(64, 0);
  for (int s = 60; s < 64; ++s) owners[s] = 1;
  const ShardMap skewed = *ShardMap::Slotted(4, owners, 3);
  const absl::StatusOr<ShardMap> even = PlanScale(skewed, 2);
  REQUIRE(even.ok());
  CHECK(Held(*even) == std::vector<int>{32, 32, 0, 0});
  CHECK(Moved(skewed, *even) == 28);
}

TEST_CASE("one shard takes every slot; the odd slot goes to the fullest") {
  const absl::StatusOr<ShardMap> one = PlanScale(Serving(4, 1), 1);
  REQUIRE(one.ok());
  CHECK(Held(*one) == std::vector<int>{64, 0, 0, 0});
  std::vector<uint16_t> owners(5);
  owners = {0, 1, 1, 1, 0};
  const absl::StatusOr<ShardMap> two =
      PlanScale(*ShardMap::Slotted(2, owners, 1), 2);
  REQUIRE(two.ok());
  CHECK(Held(*two) == std::vector<int>{2, 3});  // shard 1 keeps its 3
}

TEST_CASE(
    "a scale to 0, beyond the processes or the slots, or of a static "
    "map is refused") {
  const ShardMap two = Serving(2, 1);
  for (const int m : {0, -1, 5}) {
    const absl::StatusOr<ShardMap> bad = PlanScale(two, m);
    CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(bad.status().message()),
               Catch::Contains("--shards must be in [1, 4]"));
  }
  const absl::StatusOr<ShardMap> few =
      PlanScale(*ShardMap::Slotted(4, {0, 1}, 1), 3);
  CHECK(few.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(few.status().message()), Catch::Contains("2 slots"));
  const absl::StatusOr<ShardMap> fixed = PlanScale(*ShardMap::Static(2), 1);
  CHECK(fixed.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(fixed.status().message()),
             Catch::Contains("slotted run"));
}

}  // namespace
}  // namespace asyncps
