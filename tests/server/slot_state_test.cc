// Live slot moves at the store level: the state of a set of slots is
// captured on the shard it leaves in rounds (CaptureSlots), imported by the
// shard it goes to (SlotStateApplier, ShardStore::ImportSlice,
// TableStore::ImportRows), and both adopt the next map.
#include "server/slot_state.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "common/map_change.h"
#include "common/shard_map.h"
#include "proto/checkpoint.pb.h"
#include "store/shard_store.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/store_helpers.h"
#include "tests/testing/table_helpers.h"
#include "tests/testing/tensor_specs.h"

namespace asyncps {
namespace {

constexpr int kSlots = 64;
constexpr int kSliceElems = 16;
constexpr int kSlices = 48;
constexpr int kDim = 4;

// (version, values, optimizer state) of a slice; (version, touched,
// values, state) of a row, as bytes.
using SliceState = std::tuple<uint64_t, std::string, std::string>;
using RowState = std::tuple<uint64_t, int64_t, std::string, std::string>;
using Slices = std::map<uint32_t, SliceState>;
using Rows = std::map<uint64_t, RowState>;

std::string Bytes(const float* p, size_t n) {
  return std::string(reinterpret_cast<const char*>(p), n * sizeof(float));
}

// The map of `base` one epoch on, with `slots` given to shard `to`.
ShardMap Moved(const ShardMap& base, const std::vector<uint32_t>& slots,
               int to) {
  return WithSlotsMoved(base, slots, to).value();
}

// Shard `shard` of 2 over 64 even slots: tensor "w" (48 slices of 16, Adam)
// and table "emb" (dim 4, Adam).
std::unique_ptr<ShardStore> MakeStore(int shard) {
  ShardStoreOptions o;
  o.shard_index = shard;
  o.num_shards = 2;
  o.map = *ShardMap::EvenSlots(2, kSlots);
  std::unique_ptr<ShardStore> store = ShardStore::Create(o).value();
  CreateTensorRequest create;
  *create.add_tensors() = testing::ConstantSpec(
      "w", {kSlices * kSliceElems}, 0.5f, testing::AdamSpec(), kSliceElems);
  *create.add_tables() =
      testing::MakeTableSpec("emb", kDim, testing::AdamSpec());
  REQUIRE_OK(store->CreateTensors(create).status());
  return store;
}

// The local slices of "w" and rows of "emb" a checkpoint would hold.
void Snapshot(const ShardStore& store, Slices* slices, Rows* rows) {
  slices->clear();
  rows->clear();
  REQUIRE_OK(store.Export([](const TensorSpec&) { return absl::OkStatus(); },
                          [&](const ShardStore::SliceView& v) {
                            std::string state;
                            for (auto b : v.optimizer_state)
                              state += Bytes(b.data(), b.size());
                            (*slices)[v.index] = {
                                v.version,
                                Bytes(v.values.data(), v.values.size()), state};
                            return absl::OkStatus();
                          }));
  REQUIRE_OK(store.tables().Export(
      [](const TableSpec&) { return absl::OkStatus(); },
      [&](const SparseTable::RowView& r) {
        (*rows)[r.id] = {r.version, r.touched, Bytes(r.values, r.dim),
                         Bytes(r.state, r.state_floats)};
        return absl::OkStatus();
      }));
}

// A push of gradients `g` to every slice of `slices` and every row of
// `ids`.
absl::Status Push(ShardStore* store, const std::vector<uint32_t>& slices,
                  const std::vector<uint64_t>& ids, float g) {
  PushRequest push;
  const std::vector<float> grad(kSliceElems, g);
  for (uint32_t i : slices) {
    SliceGradient* sg = push.add_grads();
    sg->set_tensor("w");
    sg->set_slice(i);
    sg->set_grad(Bytes(grad.data(), grad.size()));
  }
  if (!ids.empty()) {
    RowsGradient* rg = push.add_rows();
    rg->set_table("emb");
    for (uint64_t id : ids) rg->add_ids(id);
    const std::vector<float> rows(ids.size() * kDim, g);
    rg->set_grad(Bytes(rows.data(), rows.size()));
  }
  PushResponse response;
  return testing::ApplyPush(store, push, StalenessRule(), &response);
}

// Two shards and a move of half of shard 0's slots to shard 1.
struct Move {
  std::unique_ptr<ShardStore> a = MakeStore(0);
  std::unique_ptr<ShardStore> b = MakeStore(1);
  const ShardMap start = a->map();
  std::vector<uint32_t> moving;  // slots
  ShardMap next;
  std::vector<uint32_t> a_slices, b_slices;  // each one's own at the start
  std::vector<uint64_t> a_ids, b_ids;        // rows each one holds

  Move() {
    for (uint32_t s = 0; s < kSlots; s += 4) moving.push_back(s);
    next = Moved(start, moving, 1);
    for (uint32_t i = 0; i < kSlices; ++i) {
      (start.SliceHome("w", i) == 0 ? a_slices : b_slices).push_back(i);
    }
    for (uint64_t id = 1; id <= 600; ++id) {
      (start.RowHome("emb", id) == 0 ? a_ids : b_ids).push_back(id);
    }
    REQUIRE_OK(Push(a.get(), a_slices, a_ids, 0.5f));
    REQUIRE_OK(Push(a.get(), a_slices, a_ids, -0.25f));
    REQUIRE_OK(Push(b.get(), b_slices, b_ids, 1.0f));
  }

  SlotSet Set() const { return *SlotSet::Of(start, moving); }
  bool SliceMoves(uint32_t i) const {
    return start.SliceHome("w", i) == 0 && next.SliceHome("w", i) == 1;
  }
  bool RowMoves(uint64_t id) const {
    return start.RowHome("emb", id) == 0 && next.RowHome("emb", id) == 1;
  }

  // One round from a to b.
  SlotCapture Round(uint32_t since, SlotApplyStats* stats) {
    absl::StatusOr<SlotCapture> c = CaptureSlots(a.get(), Set(), since);
    REQUIRE_OK(c.status());
    REQUIRE_OK(ApplySlotRecords(b.get(), c->records, stats));
    return *std::move(c);
  }
};

TEST_CASE("slots move in rounds and end bit for bit equal on the new shard",
          "[slot_moves]") {
  Move m;
  Slices a0, b0;
  Rows a0_rows, b0_rows;
  Snapshot(*m.b, &b0, &b0_rows);
  int moved_slices = 0, moved_rows = 0;
  for (uint32_t i : m.a_slices) moved_slices += m.SliceMoves(i);
  for (uint64_t id : m.a_ids) moved_rows += m.RowMoves(id);
  REQUIRE(moved_slices > 0);
  REQUIRE(moved_rows > 0);

  // Round 1: everything of the slots.
  SlotApplyStats stats;
  SlotCapture c = m.Round(0, &stats);
  CHECK(c.slices == moved_slices);
  CHECK(c.rows == moved_rows);
  CHECK(stats.slices == moved_slices);
  CHECK(stats.rows == moved_rows);
  CHECK(stats.tensors == 1);
  CHECK(stats.tables == 1);

  // Training goes on on a: some moved state changes, new rows appear.
  std::vector<uint32_t> some;
  for (size_t k = 0; k < m.a_slices.size(); k += 2) {
    some.push_back(m.a_slices[k]);
  }
  std::vector<uint64_t> new_ids;
  for (uint64_t id = 601; new_ids.size() < 50; ++id) {
    if (m.start.RowHome("emb", id) == 0) new_ids.push_back(id);
  }
  REQUIRE_OK(Push(m.a.get(), some, new_ids, 2.0f));
  int changed_slices = 0, new_rows = 0;
  for (uint32_t i : some) changed_slices += m.SliceMoves(i);
  for (uint64_t id : new_ids) new_rows += m.RowMoves(id);

  // Round 2: what changed since round 1 began.
  c = m.Round(c.next_since, &stats);
  CHECK(c.slices == changed_slices);
  CHECK(c.rows == new_rows);
  // Round 3 (pushes stopped): nothing left.
  c = m.Round(c.next_since, &stats);
  CHECK(c.slices == 0);
  CHECK(c.rows == 0);

  // Imported, not served yet: b's pulls and checkpoints leave them out.
  Slices b1;
  Rows b1_rows;
  Snapshot(*m.b, &b1, &b1_rows);
  CHECK(b1 == b0);
  CHECK(b1_rows == b0_rows);
  const absl::StatusOr<testing::PulledRows> early =
      testing::PullRows(m.b.get(), "emb", {new_ids[0]});
  CHECK(absl::IsInvalidArgument(early.status()));

  Slices a1;
  Rows a1_rows;
  Snapshot(*m.a, &a1, &a1_rows);
  const uint64_t a_reserved = m.a->Size().reserved_bytes;
  const uint64_t b_reserved = m.b->Size().reserved_bytes;
  // A checkpoint of b between the copy and the map change: what b gains is
  // stamped anew when it adopts the map, so the next delta holds it.
  const uint32_t b_since = m.b->AdvanceChangeEpoch();
  REQUIRE_OK(m.b->AdoptMap(m.next));
  REQUIRE_OK(m.a->AdoptMap(m.next));
  CHECK(m.b->Size().reserved_bytes == b_reserved);  // imported: counted
  CHECK(m.a->Size().reserved_bytes < a_reserved);

  Slices a2, b2;
  Rows a2_rows, b2_rows;
  Snapshot(*m.a, &a2, &a2_rows);
  Snapshot(*m.b, &b2, &b2_rows);
  for (const auto& [i, state] : a1) {
    if (m.SliceMoves(i)) {
      CHECK(b2.at(i) == state);  // version, values, optimizer state
      CHECK(a2.count(i) == 0);
    } else {
      CHECK(a2.at(i) == state);
    }
  }
  for (const auto& [id, state] : a1_rows) {
    if (m.RowMoves(id)) {
      CHECK(b2_rows.at(id) == state);
      CHECK(a2_rows.count(id) == 0);
    } else {
      CHECK(a2_rows.at(id) == state);
    }
  }
  for (const auto& [i, state] : b0) CHECK(b2.at(i) == state);
  for (const auto& [id, state] : b0_rows) CHECK(b2_rows.at(id) == state);
  CHECK(b2.size() == b0.size() + static_cast<size_t>(moved_slices));
  CHECK(b2_rows.size() == b0_rows.size() + moved_rows + new_rows);
  int64_t delta_rows = 0;
  REQUIRE_OK(m.b->tables().ExportSince(
      b_since, [](const TableSpec&) { return absl::OkStatus(); },
      [](absl::Span<const uint64_t>) { return absl::OkStatus(); },
      [&](const SparseTable::RowView& r) {
        delta_rows += m.RowMoves(r.id);
        return absl::OkStatus();
      }));
  CHECK(delta_rows == moved_rows + new_rows);
  REQUIRE_OK(m.b->Export([](const TensorSpec&) { return absl::OkStatus(); },
                         [&](const ShardStore::SliceView& v) {
                           if (m.SliceMoves(v.index)) {
                             CHECK(v.changed >= b_since);
                           }
                           return absl::OkStatus();
                         }));

  // The slots are b's now: a refuses them, b serves pushes to them.
  std::vector<uint32_t> moved;
  for (uint32_t i : m.a_slices) {
    if (m.SliceMoves(i)) moved.push_back(i);
  }
  const absl::Status refused = Push(m.a.get(), {moved[0]}, {}, 1.0f);
  CHECK(absl::IsInvalidArgument(refused));
  CHECK(refused.message().find("lives on shard 1, not 0") != std::string::npos);
  const absl::StatusOr<testing::PulledRows> gone =
      testing::PullRows(m.a.get(), "emb", {new_ids[0]});
  if (m.RowMoves(new_ids[0])) {
    CHECK(gone.status().message().find("lives on shard 1, not 0") !=
          std::string::npos);
  }
  REQUIRE_OK(Push(m.b.get(), moved, {}, 1.0f));
  Slices b3;
  Rows b3_rows;
  Snapshot(*m.b, &b3, &b3_rows);
  for (uint32_t i : moved) {
    CHECK(std::get<0>(b3.at(i)) == std::get<0>(b2.at(i)) + 1);
  }
}

TEST_CASE(
    "a capture racing with pushes ends bit for bit equal after the last "
    "round",
    "[slot_moves][concurrency]") {
  Move m;
  std::atomic<bool> stop{false};
  std::atomic<int> pushes{0}, failed{0};
  std::thread trainer([&] {  // no Catch2 assertion in this thread
    float g = 0.125f;
    while (!stop.load()) {
      if (!Push(m.a.get(), m.a_slices, m.a_ids, g).ok()) ++failed;
      g = -g * 1.01f;
      ++pushes;
    }
  });
  SlotApplyStats stats;
  uint32_t since = 0;
  for (int round = 0; round < 6; ++round) {
    const int before = pushes.load();
    since = m.Round(since, &stats).next_since;
    while (pushes.load() < before + 2) std::this_thread::yield();
  }
  stop = true;  // the fence: no push to the slots from here on
  trainer.join();
  CHECK(failed.load() == 0);
  m.Round(since, &stats);
  Slices a1;
  Rows a1_rows;
  Snapshot(*m.a, &a1, &a1_rows);
  REQUIRE_OK(m.b->AdoptMap(m.next));
  REQUIRE_OK(m.a->AdoptMap(m.next));
  Slices b2;
  Rows b2_rows;
  Snapshot(*m.b, &b2, &b2_rows);
  int compared = 0;
  for (const auto& [i, state] : a1) {
    if (!m.SliceMoves(i)) continue;
    CHECK(b2.at(i) == state);
    ++compared;
  }
  for (const auto& [id, state] : a1_rows) {
    if (!m.RowMoves(id)) continue;
    CHECK(b2_rows.at(id) == state);
    ++compared;
  }
  CHECK(compared > 0);
}

TEST_CASE("slot records are checked before they are applied", "[slot_moves]") {
  Move m;
  REQUIRE(absl::IsInvalidArgument(
      SlotSet::Of(m.start, std::vector<uint32_t>{3, kSlots}).status()));
  REQUIRE(absl::IsInvalidArgument(
      SlotSet::Of(*ShardMap::Static(2), std::vector<uint32_t>{0}).status()));
  absl::StatusOr<SlotCapture> c = CaptureSlots(m.a.get(), m.Set(), 0);
  REQUIRE_OK(c.status());
  // Find the records by kind.
  std::string tensor, slice, table, rows;
  for (const std::string& r : c->records) {
    CheckpointRecord rec;
    REQUIRE(rec.ParseFromString(r));
    if (rec.has_tensor()) tensor = r;
    if (rec.has_slice() && slice.empty()) slice = r;
    if (rec.has_table()) table = r;
    if (rec.has_rows() && rows.empty()) rows = r;
  }
  REQUIRE(!slice.empty());
  REQUIRE(!rows.empty());
  auto apply = [&](std::vector<std::string> records) {
    return ApplySlotRecords(m.b.get(), records, nullptr);
  };
  CHECK(absl::IsInvalidArgument(apply({"\xff\xff\xff"})));
  CHECK(absl::IsInvalidArgument(apply({slice})));  // before any tensor
  CHECK(absl::IsInvalidArgument(apply({table, slice})));
  CHECK(absl::IsInvalidArgument(apply({rows})));  // before any table

  // A slice of the wrong size.
  CheckpointRecord bad;
  bad.ParseFromString(slice);
  bad.mutable_slice()->mutable_values()->resize(7);
  absl::Status s = apply({tensor, bad.SerializeAsString()});
  CHECK(absl::IsInvalidArgument(s));
  CHECK(s.message().find("'w'") != std::string::npos);
  // Rows whose values do not fit their ids.
  bad.ParseFromString(rows);
  bad.mutable_rows()->mutable_values()->resize(12);
  s = apply({table, bad.SerializeAsString()});
  CHECK(absl::IsInvalidArgument(s));
  CHECK(s.message().find("'emb'") != std::string::npos);
  // State of a slot this shard serves is not imported.
  bad.ParseFromString(slice);
  bad.mutable_slice()->set_index(m.b_slices[0]);
  CHECK(absl::IsInvalidArgument(apply({tensor, bad.SerializeAsString()})));
  // Another spec, or a tensor this shard does not have.
  bad.ParseFromString(tensor);
  bad.mutable_tensor()->mutable_optimizer()->set_beta1(0.5f);
  s = apply({bad.SerializeAsString()});
  CHECK(absl::IsFailedPrecondition(s));
  CHECK(s.message().find("'w'") != std::string::npos);
  bad.mutable_tensor()->set_name("v");
  CHECK(absl::IsFailedPrecondition(apply({bad.SerializeAsString()})));
  // A table this shard lacks is created from the spec.
  bad.ParseFromString(table);
  bad.mutable_table()->set_name("emb2");
  SlotApplyStats stats;
  REQUIRE_OK(ApplySlotRecords(m.b.get(), {bad.SerializeAsString()}, &stats));
  CHECK(stats.tables_created == 1);
  CHECK(m.b->tables().Find("emb2") != nullptr);
  // With the move's slots given, a slice outside them is refused.
  const SlotSet other = *SlotSet::Of(m.start, std::vector<uint32_t>{1});
  SlotStateApplier strict(m.b.get(), &other);
  REQUIRE_OK(strict.Apply(tensor));
  CHECK(absl::IsInvalidArgument(strict.Apply(slice)));
  // The importing store refuses what lies past the tensor's slices.
  CHECK(absl::IsNotFound(
      m.b->ImportSlice("nope", 0, 1, std::string(64, '\0'), {})));
  CHECK(absl::IsInvalidArgument(
      m.b->ImportSlice("w", kSlices, 1, std::string(64, '\0'), {})));
}

// A run of 2 shards in which shard 1 stands by (owns no slot): shard 0
// with "w" and "emb" trained a little, shard 1 a fresh process holding
// nothing; the move gives shard 1 every other slot.
struct StandbyMove {
  ShardMap start;
  ShardMap next;
  std::vector<uint32_t> moving;
  std::unique_ptr<ShardStore> a, b;

  StandbyMove() {
    start = *ShardMap::Slotted(2, std::vector<uint16_t>(kSlots, 0),
                               ShardMap::kStaticEpoch);
    for (uint32_t s = 1; s < kSlots; s += 2) moving.push_back(s);
    next = Moved(start, moving, 1);
    ShardStoreOptions o;
    o.num_shards = 2;
    o.map = start;
    a = ShardStore::Create(o).value();
    o.shard_index = 1;
    b = ShardStore::Create(o).value();
    REQUIRE_OK(a->CreateTensors(Specs()).status());
    std::vector<uint32_t> all(kSlices);
    for (uint32_t i = 0; i < kSlices; ++i) all[i] = i;
    std::vector<uint64_t> ids;
    for (uint64_t id = 1; id <= 200; ++id) ids.push_back(id);
    REQUIRE_OK(Push(a.get(), all, ids, 0.5f));
  }

  static CreateTensorRequest Specs() {
    CreateTensorRequest create;
    *create.add_tensors() = testing::ConstantSpec(
        "w", {kSlices * kSliceElems}, 0.5f, testing::AdamSpec(), kSliceElems);
    *create.add_tables() =
        testing::MakeTableSpec("emb", kDim, testing::AdamSpec());
    return create;
  }

  // Both schedules ("w" and "emb") of `store` set to step `step`.
  static void Schedule(ShardStore* store, int64_t step, float rate) {
    SetLearningRateRequest request;
    for (const char* name : {"w", "emb"}) {
      LearningRate* r = request.add_rates();
      r->set_name(name);
      r->set_step(step);
      r->set_learning_rate(rate);
    }
    bool changed = false;
    REQUIRE_OK(store->SetLearningRates(request, &changed).status());
  }

  // Every round of the move, applied to b.
  SlotApplyStats Copy() {
    absl::StatusOr<SlotCapture> c =
        CaptureSlots(a.get(), *SlotSet::Of(start, moving), 0);
    REQUIRE_OK(c.status());
    SlotApplyStats stats;
    REQUIRE_OK(ApplySlotRecords(b.get(), c->records, &stats));
    return stats;
  }
};

// (name, step, rate) of every schedule step in effect on `store`.
std::vector<std::tuple<std::string, int64_t, float>> Rates(
    const ShardStore& store) {
  std::vector<std::tuple<std::string, int64_t, float>> out;
  for (const LearningRate& r : store.LearningRates()) {
    out.emplace_back(r.name(), r.step(), r.learning_rate());
  }
  return out;
}

TEST_CASE(
    "a move to a shard without the tensor creates it and serves its slices "
    "once the map is adopted",
    "[slot_moves][scale]") {
  StandbyMove m;
  // A standby shard can create tensors it serves no slice of.
  std::unique_ptr<ShardStore> other = [&] {
    ShardStoreOptions o;
    o.shard_index = 1;
    o.num_shards = 2;
    o.map = m.start;
    return ShardStore::Create(o).value();
  }();
  REQUIRE_OK(other->CreateTensors(StandbyMove::Specs()).status());
  CHECK(other->Size().tensors == 1);
  CHECK(other->Size().slices == 0);

  const SlotApplyStats stats = m.Copy();
  CHECK(stats.tensors_created == 1);
  CHECK(stats.tables_created == 1);
  CHECK(stats.slices > 0);
  CHECK(stats.rows > 0);
  CHECK(m.b->Size().tensors == 1);
  // Held, none served until the map gives them.
  Slices b0;
  Rows b0_rows;
  Snapshot(*m.b, &b0, &b0_rows);
  CHECK(b0.empty());
  CHECK(b0_rows.empty());
  // A client's CreateTensor of the same spec afterwards is a no-op.
  REQUIRE_OK(m.b->CreateTensors(StandbyMove::Specs()).status());

  Slices a0;
  Rows a0_rows;
  Snapshot(*m.a, &a0, &a0_rows);
  REQUIRE_OK(m.b->AdoptMap(m.next));
  REQUIRE_OK(m.a->AdoptMap(m.next));
  Slices b1;
  Rows b1_rows;
  Snapshot(*m.b, &b1, &b1_rows);
  CHECK(static_cast<int64_t>(b1.size()) == stats.slices);
  CHECK(static_cast<int64_t>(b1_rows.size()) == stats.rows);
  for (const auto& [i, state] : b1) CHECK(a0.at(i) == state);
  for (const auto& [id, state] : b1_rows) CHECK(a0_rows.at(id) == state);
  REQUIRE_OK(Push(m.b.get(), {b1.begin()->first}, {}, 1.0f));
}

TEST_CASE("a newer schedule step on the source is adopted, an older one not",
          "[slot_moves][scale]") {
  StandbyMove m;
  SECTION("the destination never saw the tensor") {
    StandbyMove::Schedule(m.a.get(), 3, 0.01f);
    m.Copy();
    CHECK(Rates(*m.b) == Rates(*m.a));
  }
  SECTION("the destination missed a SetLearningRate") {
    REQUIRE_OK(m.b->CreateTensors(StandbyMove::Specs()).status());
    StandbyMove::Schedule(m.b.get(), 1, 0.05f);
    StandbyMove::Schedule(m.a.get(), 1, 0.05f);
    StandbyMove::Schedule(m.a.get(), 4, 0.02f);
    const SlotApplyStats stats = m.Copy();
    CHECK(stats.schedules_adopted == 2);
    CHECK(Rates(*m.b) == Rates(*m.a));
    CHECK(std::get<1>(Rates(*m.b)[0]) == 4);
  }
  SECTION("the destination's step is newer") {
    REQUIRE_OK(m.b->CreateTensors(StandbyMove::Specs()).status());
    StandbyMove::Schedule(m.a.get(), 2, 0.05f);
    StandbyMove::Schedule(m.b.get(), 5, 0.001f);
    const auto before = Rates(*m.b);
    const SlotApplyStats stats = m.Copy();
    CHECK(stats.schedules_adopted == 0);
    CHECK(Rates(*m.b) == before);
    CHECK(std::get<1>(Rates(*m.b)[0]) == 5);
  }
  SECTION("the source has no schedule step") {
    REQUIRE_OK(m.b->CreateTensors(StandbyMove::Specs()).status());
    StandbyMove::Schedule(m.b.get(), 2, 0.03f);
    const auto before = Rates(*m.b);
    m.Copy();
    CHECK(Rates(*m.b) == before);
  }
}

}  // namespace
}  // namespace asyncps
