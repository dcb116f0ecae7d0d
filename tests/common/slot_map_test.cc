// The slotted shard map: keys hash into slots independent of the shard
// count, the even map places keys as the static map does when the shard
// count divides the slot count, and the map survives its wire and text
// forms exactly; malformed maps are refused with what is wrong.
#include <catch2/catch.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/shard_map.h"
#include "common/shard_map_proto.h"

namespace asyncps {
namespace {

TEST_CASE(
    "the even slotted map places keys as the static map when N divides S") {
  for (int n : {1, 2, 4, 8}) {
    const ShardMap stat = *ShardMap::Static(n);
    const ShardMap even = *ShardMap::EvenSlots(n, 4096);
    CHECK(even.slotted());
    CHECK(even.num_slots() == 4096);
    const ShardMap::TableKey emb = ShardMap::KeyOf("ctr/emb3");
    for (uint32_t i = 0; i < 500; ++i) {
      CHECK(even.SliceHome("fc0/w", i) == stat.SliceHome("fc0/w", i));
      const uint64_t id = 0x9e3779b97f4a7c15ull * (i + 1);
      CHECK(even.RowHome(emb, id) == stat.RowHome(emb, id));
    }
    CHECK(even.SlicesOn("fc0/w", 49, n - 1) ==
          stat.SlicesOn("fc0/w", 49, n - 1));
  }
  // 3 does not divide 4096: the even map is another placement (still even).
  const ShardMap three = *ShardMap::EvenSlots(3, 4096);
  std::vector<int> count(3, 0);
  for (uint32_t i = 0; i < 3000; ++i) ++count[three.SliceHome("t", i)];
  CHECK(count == std::vector<int>{1000, 1000, 1000});
}

TEST_CASE(
    "a key's slot does not depend on the shards; owners decide the home") {
  std::vector<uint16_t> owners(64, 0);
  owners[ShardMap::EvenSlots(1, 64)->SliceSlot("w", 5)] = 1;
  const ShardMap a = *ShardMap::Slotted(2, owners, 7);
  const ShardMap b = *ShardMap::Slotted(5, std::vector<uint16_t>(64, 4), 9);
  CHECK(a.SliceSlot("w", 5) == b.SliceSlot("w", 5));
  CHECK(a.SliceHome("w", 5) == 1);
  CHECK(a.SliceHome("w", 6) == 0);
  CHECK(b.RowHome("emb", 123) == 4);
  CHECK(a.SlicesOn("w", 64, 1) == 1);
  CHECK(a.SlicesOn("w", 64, 0) == 63);
  CHECK(a.DebugString() == "map of 64 slots over 2 shards, epoch 7");
  CHECK(a != b);
  CHECK(a == *ShardMap::Slotted(2, owners, 7));
  CHECK(a != *ShardMap::Slotted(2, owners, 8));
  CHECK(*ShardMap::Static(2) != *ShardMap::EvenSlots(2, 2));
}

TEST_CASE("serving shards are the ones that own a slot") {
  CHECK(ShardMap::Static(3)->serving_shards() == std::vector<int>{0, 1, 2});
  CHECK(ShardMap::EvenSlots(2, 8)->serving_shards() == std::vector<int>{0, 1});
  // Shards 1 and 3 of 4 own nothing (standby, or drained by psctl scale).
  const absl::StatusOr<ShardMap> partial =
      ShardMap::Slotted(4, {0, 2, 2, 0, 0}, 5);
  REQUIRE(partial.ok());
  CHECK(partial->serving_shards() == std::vector<int>{0, 2});
  // A client indexes a call's per-shard state by these positions.
  CHECK(partial->ServingPosition(0) == 0);
  CHECK(partial->ServingPosition(1) == -1);
  CHECK(partial->ServingPosition(2) == 1);
  CHECK(partial->ServingPosition(3) == -1);
  CHECK(ShardMap::Static(3)->ServingPosition(2) == 2);
  // Many groups declared, two serving.
  std::vector<uint16_t> owners(64);
  for (size_t s = 0; s < owners.size(); ++s) owners[s] = s % 2 ? 60000 : 7;
  const absl::StatusOr<ShardMap> wide =
      ShardMap::Slotted(ShardMap::kMaxShards, owners, 2);
  REQUIRE(wide.ok());
  CHECK(wide->serving_shards() == std::vector<int>{7, 60000});
  CHECK(wide->ServingPosition(7) == 0);
  CHECK(wide->ServingPosition(60000) == 1);
  CHECK(wide->ServingPosition(ShardMap::kMaxShards - 1) == -1);
}

TEST_CASE("bad maps are refused with what is wrong") {
  CHECK(ShardMap::Slotted(2, {0, 2}, 1).status().message() ==
        "slot 1 is owned by shard 2, but the map has only 2 shards");
  CHECK(!ShardMap::Slotted(2, {}, 1).ok());
  CHECK(!ShardMap::Slotted(0, {0}, 1).ok());
  CHECK(!ShardMap::Slotted(1, {0}, 0).ok());
  CHECK(ShardMap::EvenSlots(5, 4).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(!ShardMap::EvenSlots(1, ShardMap::kMaxSlots + 1).ok());
}

TEST_CASE("a map survives its wire form; malformed wire maps are refused") {
  std::vector<uint16_t> owners(1000);
  for (size_t s = 0; s < owners.size(); ++s) owners[s] = (s * 7) % 300;
  const ShardMap map = *ShardMap::Slotted(300, owners, 42);
  ShardMapProto wire;
  ShardMapToProto(map, &wire);
  CHECK(wire.owners().size() == 2000);
  CHECK(*ShardMapFromProto(wire) == map);

  ShardMapToProto(*ShardMap::Static(3), &wire);
  CHECK(*ShardMapFromProto(wire) == *ShardMap::Static(3));
  CHECK(*ShardMapOr(ShardMapProto(), 5) == *ShardMap::Static(5));

  ShardMapToProto(map, &wire);
  wire.mutable_owners()->pop_back();
  CHECK(ShardMapFromProto(wire).status().code() ==
        absl::StatusCode::kInvalidArgument);
  ShardMapToProto(map, &wire);
  wire.set_num_shards(299);  // owner 299 exists
  CHECK(!ShardMapFromProto(wire).ok());
  ShardMapToProto(map, &wire);
  wire.set_num_slots(-1);
  CHECK(!ShardMapFromProto(wire).ok());
}

TEST_CASE(
    "a request routed with an older map is refused with the shard's map, one "
    "with a newer map is retried") {
  absl::StatusOr<ShardMap> map = ShardMap::Slotted(2, {0, 1, 1, 0}, 5);
  REQUIRE(map.ok());
  CHECK(CheckRouted(*map, 0).ok());
  CHECK(CheckRouted(*map, 5).ok());
  CHECK(!RefusalMap(absl::OkStatus()).has_value());
  const absl::Status older = CheckRouted(*map, 4);
  CHECK(absl::IsFailedPrecondition(older));
  std::optional<ShardMapProto> carried = RefusalMap(older);
  REQUIRE(carried.has_value());
  CHECK(*ShardMapFromProto(*carried) == *map);
  const absl::Status newer = CheckRouted(*map, 6);
  CHECK(absl::IsUnavailable(newer));
  CHECK(newer.message() ==
        "shard serves map epoch 5, the request was routed with 6; retry");
  CHECK(!RefusalMap(newer).has_value());
  // The refusal of a newer map says which epoch the shard serves (a client
  // holding the newer one hands it over); no other status does.
  CHECK(ServedMapEpoch(newer) == std::optional<uint64_t>(5));
  CHECK(!ServedMapEpoch(older).has_value());
  CHECK(!ServedMapEpoch(absl::UnavailableError("fenced")).has_value());
  CHECK(!ServedMapEpoch(WithServedMapEpoch(absl::UnavailableError("x"), 0))
             .has_value());
  CHECK(ServedMapEpoch(WithServedMapEpoch(absl::UnavailableError("x"), 9)) ==
        std::optional<uint64_t>(9));
  // Another failure carries no map, even with the code of a refusal.
  CHECK(!RefusalMap(absl::FailedPreconditionError("fenced")).has_value());
}

TEST_CASE("a map survives its text form; bad files say which line") {
  std::vector<uint16_t> owners(16, 0);
  for (int s : {3, 4, 5, 9, 15}) owners[s] = 2;
  owners[7] = 1;
  const ShardMap map = *ShardMap::Slotted(3, owners, 5);
  const std::string text = ShardMapToText(map);
  CHECK(text.find("shard 2: 3-5 9 15\n") != std::string::npos);
  CHECK(text.find("shard 1: 7\n") != std::string::npos);
  CHECK(*ShardMapFromText(text) == map);

  CHECK(
      ShardMapFromText("epoch 1\nshards 2\nslots 4\nshard 0: 0-3\nshard 1: 3\n")
          .status()
          .message() == "shard map line 5: slot 3 listed twice");
  CHECK(ShardMapFromText("epoch 1\nshards 2\nslots 4\nshard 0: 0-2\n")
            .status()
            .message() == "slot 3 has no shard in the shard map file");
  CHECK(!ShardMapFromText("epoch 1\nshards 2\nslots 4\nshard 2: 0-3\n").ok());
  CHECK(!ShardMapFromText("epoch 1\nshards 2\nslots 4\nshard 0: 0-9\n").ok());
  CHECK(!ShardMapFromText("shards 2\nslots 4\nshard 0: 0-3\n").ok());
  CHECK(ShardMapFromText("epoch x\n").status().message() ==
        "shard map line 1: expected 'epoch N' with 1 <= N <= "
        "4611686018427387904");
  const ShardMap late = *ShardMap::Slotted(1, {0}, 5000000000ull);
  CHECK(*ShardMapFromText(ShardMapToText(late)) == late);
}

}  // namespace
}  // namespace asyncps
