// The starting map of a run launched with standby shards (ps_server
// --serving_shards=K): slots spread over shards 0..K-1 only, the same map
// on every shard, and restored files' maps winning over the flags.
#include "server/starting_map.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "common/shard_map.h"
#include "server/checkpoint.h"
#include "server/spec_file.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

// The map shard `shard` of `num_shards` starts with, without files.
absl::StatusOr<ShardMap> Fresh(int shard, int num_shards, int slots,
                               int serving) {
  return StartingShardMap(
      {"", true, shard, num_shards, slots, nullptr, serving});
}

TEST_CASE("--serving_shards=K spreads the slots over shards 0..K-1 only",
          "[starting_map][scale]") {
  const absl::StatusOr<ShardMap> map = Fresh(0, 5, 16, 2);
  REQUIRE_OK(map.status());
  CHECK(map->num_shards() == 5);
  CHECK(map->num_slots() == 16);
  CHECK(map->epoch() == ShardMap::kStaticEpoch);
  for (int s = 0; s < 16; ++s) CHECK(map->owners()[s] == s % 2);
  // Every shard computes the same map, standby ones included.
  for (int shard = 1; shard < 5; ++shard) {
    CHECK(*Fresh(shard, 5, 16, 2) == *map);
  }
  // Keys land on serving shards only.
  for (uint32_t i = 0; i < 64; ++i) CHECK(map->SliceHome("w", i) < 2);
  for (uint64_t id = 0; id < 1000; ++id) CHECK(map->RowHome("emb", id) < 2);
  // K = N is the even map; 0 = every shard, as without the flag.
  CHECK(*Fresh(0, 3, 12, 3) == *ShardMap::EvenSlots(3, 12));
  CHECK(*Fresh(0, 3, 12, 0) == *ShardMap::EvenSlots(3, 12));
  // Fewer slots than shards is fine as long as every serving shard gets one.
  const absl::StatusOr<ShardMap> few = Fresh(3, 4, 2, 2);
  REQUIRE_OK(few.status());
  CHECK(few->owners() ==
        absl::Span<const uint16_t>(std::vector<uint16_t>{0, 1}));
}

TEST_CASE("bad --serving_shards values are INVALID_ARGUMENT naming the flag",
          "[starting_map][scale]") {
  for (const auto& [shards, slots, serving] :
       std::vector<std::tuple<int, int, int>>{{3, 0, 1},     // not slotted
                                              {3, 16, 4},    // > num_shards
                                              {3, 16, -1},   // negative
                                              {3, 2, 3}}) {  // < one slot each
    const absl::Status s = Fresh(0, shards, slots, serving).status();
    INFO(shards << " shards, " << slots << " slots, serving " << serving);
    CHECK(absl::IsInvalidArgument(s));
    CHECK((absl::StrContains(s.message(), "--serving_shards") ||
           absl::StrContains(s.message(), "--num_slots")));
  }
  CHECK(absl::StrContains(Fresh(0, 3, 0, 1).status().message(), "--num_slots"));
}

TEST_CASE("restored files' map wins over --serving_shards",
          "[starting_map][scale]") {
  const std::string dir = testing::MakeTmpDir("serving");
  // The files of shard 2 of 3, written after a move gave it slots.
  std::vector<uint16_t> owners(8);
  for (int s = 0; s < 8; ++s) owners[s] = static_cast<uint16_t>(s % 3);
  const ShardMap moved = *ShardMap::Slotted(3, owners, 4);
  SpecFileContents files;
  files.identity.set_shard_index(2);
  files.identity.set_num_shards(3);
  files.identity.set_run_id("run");
  SetIdentityMap(moved, &files.identity);
  REQUIRE_OK(WriteSpecFile(SpecFilePath(dir, 2, 3), files));
  const absl::StatusOr<ShardMap> restored =
      StartingShardMap({dir, true, 2, 3, 8, nullptr, 1});
  REQUIRE_OK(restored.status());
  CHECK(*restored == moved);
  // Without restoring, the flags' map: shard 2 stands by.
  const absl::StatusOr<ShardMap> fresh =
      StartingShardMap({dir, false, 2, 3, 8, nullptr, 1});
  REQUIRE_OK(fresh.status());
  CHECK(fresh->SlicesOn("w", 100, 2) == 0);
  CHECK(fresh->SlicesOn("w", 100, 0) == 100);
}

}  // namespace
}  // namespace asyncps
