// ShardStore::AdoptMap: the map a store serves changes under a new epoch,
// the slices and rows of slots it gives away are dropped, and pulls running
// meanwhile see the map before or the map after, never a mix.
#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/map_change.h"
#include "common/shard_map.h"
#include "store/shard_store.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/store_helpers.h"
#include "tests/testing/table_helpers.h"
#include "tests/testing/tensor_specs.h"

namespace asyncps {
namespace {

constexpr int kSlots = 64;
constexpr int kSliceElems = 16;
constexpr int kSlices = 40;

// The map of `base` one epoch on, with `slots` given to shard `to`.
ShardMap Moved(const ShardMap& base, const std::vector<uint32_t>& slots,
               int to) {
  return WithSlotsMoved(base, slots, to).value();
}

// Shard `shard` of 2 over 64 even slots, with tensor "w" (40 slices of 16,
// Adam) and table "emb" (dim 4, Adam).
std::unique_ptr<ShardStore> MakeStore(int shard) {
  ShardStoreOptions o;
  o.shard_index = shard;
  o.num_shards = 2;
  o.map = *ShardMap::EvenSlots(2, kSlots);
  std::unique_ptr<ShardStore> store = ShardStore::Create(o).value();
  CreateTensorRequest create;
  *create.add_tensors() = testing::ConstantSpec(
      "w", {kSlices * kSliceElems}, 0.5f, testing::AdamSpec(), kSliceElems);
  *create.add_tables() = testing::MakeTableSpec("emb", 4, testing::AdamSpec());
  REQUIRE_OK(store->CreateTensors(create).status());
  return store;
}

// The ids among 1..n homed on `shard` under `map`.
std::vector<uint64_t> IdsHomed(const ShardMap& map, int shard, uint64_t n) {
  std::vector<uint64_t> ids;
  for (uint64_t id = 1; id <= n; ++id) {
    if (map.RowHome("emb", id) == shard) ids.push_back(id);
  }
  return ids;
}

// The slice indices of "w" a pull answers; an error is a slice ~0. No
// Catch2 assertion: threads call it.
std::set<uint32_t> PulledSlices(const ShardStore& store) {
  PullRequest pull;
  pull.add_tensors("w");
  PullResponse response;
  if (!store.Pull(pull, &response).ok()) return {~0u};
  std::set<uint32_t> out;
  for (const SliceData& d : response.slices()) out.insert(d.slice());
  return out;
}

// The slices of "w" homed on `shard` under `map`.
std::set<uint32_t> SlicesHomed(const ShardMap& map, int shard) {
  std::set<uint32_t> out;
  for (uint32_t i = 0; i < kSlices; ++i) {
    if (map.SliceHome("w", i) == shard) out.insert(i);
  }
  return out;
}

// A gradient of ones for slice `slice` of "w".
absl::Status PushSlice(ShardStore* store, uint32_t slice) {
  PushRequest push;
  SliceGradient* g = push.add_grads();
  g->set_tensor("w");
  g->set_slice(slice);
  const std::vector<float> ones(kSliceElems, 1.0f);
  g->set_grad(std::string(reinterpret_cast<const char*>(ones.data()),
                          ones.size() * sizeof(float)));
  PushResponse response;
  return testing::ApplyPush(store, push, StalenessRule(), &response);
}

TEST_CASE(
    "a store adopts only a later slotted map of its slot and shard counts",
    "[adopt_map]") {
  std::unique_ptr<ShardStore> store = MakeStore(0);
  const ShardMap start = store->map();
  CHECK(store->map_epoch() == start.epoch());
  const ShardMap next = Moved(start, {0, 2}, 1);

  // The map served now again: a no-op.
  REQUIRE_OK(store->CheckAdoptable(start));
  REQUIRE_OK(store->AdoptMap(start));
  CHECK(store->map() == start);

  const absl::Status static_map = store->CheckAdoptable(*ShardMap::Static(2));
  CHECK(absl::IsInvalidArgument(static_map));
  CHECK(absl::IsInvalidArgument(
      store->CheckAdoptable(*ShardMap::Slotted(2, {0, 1}, 5))));
  CHECK(absl::IsInvalidArgument(store->CheckAdoptable(
      *ShardMap::Slotted(3, std::vector<uint16_t>(kSlots, 2), 5))));
  // Another map at the same epoch, or an older one.
  std::vector<uint16_t> owners(next.owners().begin(), next.owners().end());
  const ShardMap same_epoch = *ShardMap::Slotted(2, owners, start.epoch());
  const absl::Status s = store->AdoptMap(same_epoch);
  CHECK(absl::IsFailedPrecondition(s));
  CHECK(s.message().find("epoch 1") != std::string::npos);
  CHECK(store->map() == start);

  REQUIRE_OK(store->CheckAdoptable(next));
  CHECK(store->map() == start);  // checking changes nothing
  // A precondition that fails (a slot move's, under the store's map lock):
  // its error, and nothing changed.
  const absl::Status refused = store->AdoptMap(
      next, [] { return absl::FailedPreconditionError("not yet"); });
  CHECK(refused.message() == "not yet");
  CHECK(store->map() == start);
  REQUIRE_OK(store->AdoptMap(next));
  CHECK(store->map() == next);
  CHECK(store->map_epoch() == next.epoch());
  REQUIRE_OK(store->AdoptMap(next));  // again: a no-op
  const absl::Status older = store->AdoptMap(start);
  CHECK(absl::IsFailedPrecondition(older));
  CHECK(older.message().find("epoch 1,") != std::string::npos);
  CHECK(older.message().find("epoch 2") != std::string::npos);
}

TEST_CASE("OwnsSameSlots compares one shard's slots of two maps",
          "[adopt_map]") {
  const ShardMap even = *ShardMap::EvenSlots(3, kSlots);
  const ShardMap moved = Moved(even, {1}, 2);  // from shard 1 to 2
  CHECK(OwnsSameSlots(even, moved, 0));
  CHECK_FALSE(OwnsSameSlots(even, moved, 1));
  CHECK_FALSE(OwnsSameSlots(even, moved, 2));
  CHECK_FALSE(OwnsSameSlots(even, *ShardMap::EvenSlots(3, 32), 0));
  CHECK_FALSE(OwnsSameSlots(even, *ShardMap::Static(3), 0));
  CHECK(OwnsSameSlots(*ShardMap::Static(3), *ShardMap::Static(3), 1));
}

TEST_CASE("adopting a map drops the slices and rows of the slots given away",
          "[adopt_map]") {
  std::unique_ptr<ShardStore> store = MakeStore(0);
  const ShardMap start = store->map();
  const std::vector<uint64_t> ids = IdsHomed(start, 0, 400);
  REQUIRE(testing::PushRows(store.get(), "emb", ids,
                            std::vector<float>(ids.size() * 4, 0.25f))
              .ok());
  for (uint32_t i : SlicesHomed(start, 0))
    REQUIRE_OK(PushSlice(store.get(), i));
  const StoreSize before = store->Size();

  // Half of shard 0's slots go to shard 1.
  std::vector<uint32_t> away;
  for (uint32_t s = 0; s < kSlots; s += 4) away.push_back(s);
  const ShardMap next = Moved(start, away, 1);
  REQUIRE_OK(store->AdoptMap(next));

  const std::set<uint32_t> kept = SlicesHomed(next, 0);
  CHECK(PulledSlices(*store) == kept);
  const uint64_t dropped_slices = SlicesHomed(start, 0).size() - kept.size();
  REQUIRE(dropped_slices > 0);
  const std::vector<uint64_t> kept_ids = IdsHomed(next, 0, 400);
  const uint64_t dropped_rows = ids.size() - kept_ids.size();
  REQUIRE(dropped_rows > 0);
  const uint64_t row_bytes = store->tables().Find("emb")->row_bytes();
  const StoreSize after = store->Size();
  CHECK(after.slices == before.slices - static_cast<int32_t>(dropped_slices));
  CHECK(after.table_rows == before.table_rows - dropped_rows);
  // Each slice: 16 values, 2 Adam buffers, 256 bytes of bookkeeping.
  CHECK(before.reserved_bytes - after.reserved_bytes ==
        dropped_slices * (kSliceElems * 3 * 4 + 256) +
            dropped_rows * row_bytes);

  // What went is refused as another shard's; what stayed is served as
  // before.
  for (uint32_t i = 0; i < kSlices; ++i) {
    if (start.SliceHome("w", i) != 0 || kept.count(i) > 0) continue;
    const absl::Status s = PushSlice(store.get(), i);
    CHECK(absl::IsInvalidArgument(s));
    CHECK(s.message().find("lives on shard 1, not 0") != std::string::npos);
  }
  for (uint32_t i : kept) REQUIRE_OK(PushSlice(store.get(), i));
  for (uint64_t id : ids) {
    const absl::StatusOr<testing::PulledRows> r =
        testing::PullRows(store.get(), "emb", {id});
    if (next.RowHome("emb", id) == 0) {
      REQUIRE_OK(r.status());
      CHECK(r->versions[0] == 1);
    } else {
      CHECK(absl::IsInvalidArgument(r.status()));
      CHECK(r.status().message().find("lives on shard 1, not 0") !=
            std::string::npos);
    }
  }
  // A checkpoint holds what is left.
  int64_t exported_slices = 0;
  REQUIRE_OK(store->Export([](const TensorSpec&) { return absl::OkStatus(); },
                           [&](const ShardStore::SliceView&) {
                             ++exported_slices;
                             return absl::OkStatus();
                           }));
  CHECK(exported_slices == static_cast<int64_t>(kept.size()));
}

TEST_CASE("pulls during AdoptMap see the slices of one map",
          "[adopt_map][concurrency]") {
  std::unique_ptr<ShardStore> store = MakeStore(0);
  const ShardMap start = store->map();
  std::vector<uint32_t> away;
  for (int s = 0; s < kSlots; s += 2) {
    if (start.owners()[s] == 0 && s % 4 == 0) away.push_back(s);
  }
  const ShardMap next = Moved(start, away, 1);
  const std::set<uint32_t> old_slices = SlicesHomed(start, 0);
  const std::set<uint32_t> new_slices = SlicesHomed(next, 0);
  REQUIRE(old_slices != new_slices);
  const std::vector<uint64_t> kept_ids = IdsHomed(next, 0, 200);

  std::atomic<bool> stop{false};
  std::atomic<int> mixed{0}, pulls{0}, row_errors{0};
  std::vector<std::thread> pullers;
  for (int t = 0; t < 4; ++t) {
    pullers.emplace_back([&] {
      while (!stop.load()) {
        const std::set<uint32_t> got = PulledSlices(*store);
        if (got != old_slices && got != new_slices) ++mixed;
        if (!testing::PullRows(store.get(), "emb", kept_ids).ok()) {
          ++row_errors;
        }
        ++pulls;
      }
    });
  }
  while (pulls.load() < 20) std::this_thread::yield();
  REQUIRE_OK(store->AdoptMap(next));
  const int at_adopt = pulls.load();
  while (pulls.load() < at_adopt + 20) std::this_thread::yield();
  stop = true;
  for (std::thread& t : pullers) t.join();
  CHECK(mixed.load() == 0);
  CHECK(row_errors.load() == 0);
  CHECK(PulledSlices(*store) == new_slices);
}

TEST_CASE(
    "slots a map gives a store that never received them are made anew, "
    "as created, when the map is the run's own",
    "[adopt_map]") {
  std::unique_ptr<ShardStore> store = MakeStore(1);
  const ShardMap start = store->map();
  // Half of shard 0's slots moved here by a move whose state was lost.
  std::vector<uint32_t> slots;
  for (uint32_t slot = 0; slot < kSlots; slot += 4) slots.push_back(slot);
  const ShardMap next = Moved(start, slots, 1);
  const std::set<uint32_t> gained = [&] {
    std::set<uint32_t> out = SlicesHomed(next, 1);
    for (uint32_t i : SlicesHomed(start, 1)) out.erase(i);
    return out;
  }();
  REQUIRE_FALSE(gained.empty());
  const uint64_t bytes_before = store->Size().reserved_bytes;

  absl::StatusOr<uint64_t> made = store->AdoptMapRemakingLost(next);
  REQUIRE_OK(made.status());
  CHECK(*made == gained.size());
  CHECK(store->Size().slices_remade == gained.size());
  CHECK(store->map_epoch() == next.epoch());
  CHECK(PulledSlices(*store) == SlicesHomed(next, 1));
  CHECK(store->Size().reserved_bytes > bytes_before);
  // Their values are the spec's (constant 0.5), and they take pushes.
  PullRequest pull;
  pull.add_tensors("w");
  PullResponse response;
  REQUIRE_OK(store->Pull(pull, &response));
  for (const SliceData& d : response.slices()) {
    if (gained.count(d.slice()) == 0) continue;
    std::vector<float> v(d.values().size() / sizeof(float));
    std::memcpy(v.data(), d.values().data(), d.values().size());
    for (float x : v) CHECK(x == 0.5f);
  }
  REQUIRE_OK(PushSlice(store.get(), *gained.begin()));
  // Adopting it again is a no-op that makes nothing.
  made = store->AdoptMapRemakingLost(next);
  REQUIRE_OK(made.status());
  CHECK(*made == 0);
  CHECK(store->Size().slices_remade == gained.size());
  // An older map is refused, nothing changed.
  CHECK(
      absl::IsFailedPrecondition(store->AdoptMapRemakingLost(start).status()));
  CHECK(store->map_epoch() == next.epoch());
}

}  // namespace
}  // namespace asyncps
