// Re-splitting the parts of a push that shards refused for an older map:
// every slice and row lands once, on its home by the new map, with exactly
// its own payload bytes (float32 or bfloat16), the header fields kept and
// read_epoch kept only where the part goes back to the shard that sent it.
#include "client/push_split.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/shard_map.h"
#include "proto/asyncps.pb.h"
#include "tests/testing/slices.h"

namespace asyncps {
namespace {

using testing::JoinSlices;

// `bytes` cut into pieces of `piece` bytes (so gradients straddle pieces).
std::vector<grpc::Slice> Pieces(const std::string& bytes, size_t piece) {
  std::vector<grpc::Slice> out;
  for (size_t at = 0; at < bytes.size(); at += piece) {
    const std::string part = bytes.substr(at, piece);
    out.emplace_back(part.data(), part.size());
  }
  return out;
}

// A part as shard `shard` got it under `old_map`: slices of "w" and rows of
// "emb" it owned there, each gradient's bytes distinct; `expected` gets
// every gradient's bytes by key ("w/<slice>", "emb/<id>").
PushPart MakePart(int shard, const ShardMap& old_map, size_t value_bytes,
                  std::map<std::string, std::string>* expected) {
  PushPart part;
  part.shard = shard;
  PushRequest& h = part.header;
  h.mutable_worker()->set_worker_id(3);
  h.mutable_worker()->set_clock(17);
  h.set_seq(41);
  h.set_read_epoch(900 + shard);
  h.set_map_epoch(old_map.epoch());
  h.set_wire_dtype(value_bytes == 2 ? WIRE_BF16 : WIRE_F32);
  std::string payload;
  char next = 1;
  for (uint32_t i = 0; i < 40; ++i) {
    if (old_map.SliceHome("w", i) != shard) continue;
    const size_t n = (5 + i % 3) * value_bytes;  // slices of unequal sizes
    SliceGradient* g = h.add_grads();
    g->set_tensor("w");
    g->set_slice(i);
    g->set_read_version(100 + i);
    g->set_grad_bytes(n);
    const std::string bytes(n, next++);
    (*expected)["w/" + std::to_string(i)] = bytes;
    payload += bytes;
  }
  RowsGradient* r = h.add_rows();
  r->set_table("emb");
  const size_t row = 3 * value_bytes;
  const ShardMap::TableKey key = ShardMap::KeyOf("emb");
  for (uint64_t id = 1; id < 200; ++id) {
    if (old_map.RowHome(key, id * 7919) != shard) continue;
    r->add_ids(id * 7919);
    r->add_read_versions(id);
    std::string bytes(row, next++);
    if (value_bytes == 2) bytes[0] = static_cast<char>(id);  // still distinct
    (*expected)["emb/" + std::to_string(id * 7919)] = bytes;
    payload += bytes;
  }
  r->set_grad_bytes(r->ids_size() * row);
  part.payload = Pieces(payload, 7);
  return part;
}

// Checks the split against `expected` and `map`; returns the keys seen.
std::map<std::string, int> Check(
    const std::vector<PushPart>& parts, const ShardMap& map,
    const std::map<std::string, std::string>& expected,
    const std::vector<int>& senders) {
  std::map<std::string, int> seen;
  const ShardMap::TableKey key = ShardMap::KeyOf("emb");
  int last = -1;
  for (const PushPart& p : parts) {
    CHECK(p.shard > last);  // shard order, one part each
    last = p.shard;
    const PushRequest& h = p.header;
    CHECK(h.seq() == 41);
    CHECK(h.worker().clock() == 17);
    const bool sender =
        std::find(senders.begin(), senders.end(), p.shard) != senders.end();
    CHECK(h.read_epoch() == (sender ? 900u + p.shard : 0u));
    const std::string bytes = JoinSlices(p.payload);
    size_t at = 0;
    for (const SliceGradient& g : h.grads()) {
      CHECK(map.SliceHome(g.tensor(), g.slice()) == p.shard);
      CHECK(g.read_version() == 100 + g.slice());
      const std::string k = "w/" + std::to_string(g.slice());
      CHECK(bytes.substr(at, g.grad_bytes()) == expected.at(k));
      at += g.grad_bytes();
      ++seen[k];
    }
    for (const RowsGradient& r : h.rows()) {
      REQUIRE(r.ids_size() > 0);
      REQUIRE(r.read_versions_size() == r.ids_size());
      const size_t row = r.grad_bytes() / r.ids_size();
      for (int i = 0; i < r.ids_size(); ++i) {
        CHECK(map.RowHome(key, r.ids(i)) == p.shard);
        CHECK(r.read_versions(i) == r.ids(i) / 7919);
        const std::string k = "emb/" + std::to_string(r.ids(i));
        CHECK(bytes.substr(at, row) == expected.at(k));
        at += row;
        ++seen[k];
      }
    }
    CHECK(at == bytes.size());
  }
  return seen;
}

TEST_CASE(
    "refused push parts are split by the new map: every slice and row once, "
    "at its new home, with its own bytes",
    "[push][map]") {
  const ShardMap old_map = *ShardMap::EvenSlots(3, 12);
  // Slots 0 and 3 (shard 0's) and 4 (shard 1's) move to shard 2.
  std::vector<uint16_t> owners(old_map.owners().begin(),
                               old_map.owners().end());
  owners[0] = owners[3] = owners[4] = 2;
  const ShardMap new_map = *ShardMap::Slotted(3, owners, 2);

  for (const size_t value_bytes : {size_t{4}, size_t{2}}) {  // f32, bf16
    INFO("bytes per value " << value_bytes);
    std::map<std::string, std::string> expected;
    const std::vector<PushPart> refused = {
        MakePart(0, old_map, value_bytes, &expected),
        MakePart(1, old_map, value_bytes, &expected)};
    absl::StatusOr<std::vector<PushPart>> parts =
        SplitPushParts(refused, new_map);
    REQUIRE(parts.ok());
    // Shard 2 refused nothing but gets what moved to it; the senders keep
    // a part each (possibly empty).
    REQUIRE(parts->size() == 3);
    const std::map<std::string, int> seen =
        Check(*parts, new_map, expected, {0, 1});
    CHECK(seen.size() == expected.size());
    for (const auto& [k, n] : seen) CHECK(n == 1);
    CHECK((*parts)[2].header.grads_size() + (*parts)[2].header.rows_size() > 0);
    CHECK((*parts)[2].header.wire_dtype() ==
          (value_bytes == 2 ? WIRE_BF16 : WIRE_F32));
  }
}

TEST_CASE("a part whose payload disagrees with its header is not split",
          "[push][map][bad-input]") {
  const ShardMap map = *ShardMap::EvenSlots(2, 8);
  std::map<std::string, std::string> expected;
  PushPart part = MakePart(0, map, 4, &expected);
  PushPart short_part = part;
  short_part.payload = Pieces(JoinSlices(part.payload).substr(1), 5);
  CHECK(absl::IsInvalidArgument(SplitPushParts({short_part}, map).status()));
  PushPart long_part = part;
  long_part.payload.emplace_back("x", 1);
  CHECK(absl::IsInvalidArgument(SplitPushParts({long_part}, map).status()));
  PushPart odd_rows = part;
  odd_rows.header.mutable_rows(0)->set_grad_bytes(
      odd_rows.header.rows(0).grad_bytes() + 1);
  CHECK(absl::IsInvalidArgument(SplitPushParts({odd_rows}, map).status()));
  // By its own map, a part goes back whole to its shard.
  absl::StatusOr<std::vector<PushPart>> same = SplitPushParts({part}, map);
  REQUIRE(same.ok());
  REQUIRE(same->size() == 1);
  CHECK(JoinSlices((*same)[0].payload) == JoinSlices(part.payload));
  CHECK((*same)[0].header.read_epoch() == 900);
}

}  // namespace
}  // namespace asyncps
