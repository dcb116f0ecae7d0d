// Sparse tables that never fill up: the admission sketch and filter
// (store/admission_filter.h) and eviction under --max_parameter_bytes
// (store/row_eviction.h) through the shard store's request path.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common/row_initializer.h"
#include "store/admission_filter.h"
#include "store/row_eviction.h"
#include "store/shard_store.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/store_helpers.h"
#include "tests/testing/table_helpers.h"

namespace asyncps {
namespace {

using testing::CreateTable;
using testing::MakeTableSpec;
using testing::PulledRows;
using testing::PullRows;
using testing::PushRows;

constexpr int kDim = 4;
// SGD keeps no state: values and the per-row overhead.
constexpr uint64_t kRowBytes = kDim * 4 + SparseTable::kRowOverheadBytes;

OptimizerSpec Sgd() {
  OptimizerSpec o;
  o.set_type(OPT_SGD);
  o.set_learning_rate(1.0f);
  return o;
}

TableSpec Spec(EvictionPolicy eviction = EVICT_TTL,
               AdmissionPolicy admission = ADMIT_ALL) {
  TableSpec t = MakeTableSpec("emb", kDim, Sgd());
  t.set_eviction(eviction);
  t.set_admission(admission);
  return t;
}

std::unique_ptr<ShardStore> Store(uint64_t cap = 0) {
  ShardStoreOptions o;
  o.max_parameter_bytes = cap;
  return ShardStore::Create(o).value();
}

std::vector<float> Grads(size_t ids, float g = 1.0f) {
  return std::vector<float>(ids * kDim, g);
}

std::vector<uint64_t> Range(uint64_t begin, uint64_t end) {
  std::vector<uint64_t> out;
  for (uint64_t id = begin; id < end; ++id) out.push_back(id);
  return out;
}

bool Holds(const ShardStore& store, uint64_t id, uint64_t* version) {
  float values[kDim];
  return store.tables().Find("emb")->Peek(id, values, version);
}

TEST_CASE("the sketch counts exactly when ids share no counter",
          "[admission][sketch]") {
  CountMinSketch sketch(1 << 16, 3);
  REQUIRE(sketch.bytes() == 4u << 16);
  // Id i occurs i times, interleaved.
  for (uint32_t round = 1; round <= 20; ++round) {
    for (uint64_t id = round; id <= 20; ++id) {
      REQUIRE(sketch.Add(id * 7919) == round);
    }
  }
  for (uint64_t id = 1; id <= 20; ++id) {
    REQUIRE(sketch.Estimate(id * 7919) == id);
  }
  REQUIRE(sketch.Estimate(12345) == 0);
  // A crowded sketch may overestimate, never underestimate.
  CountMinSketch small(64, 3);
  for (uint64_t id = 0; id < 200; ++id) {
    for (uint64_t k = 0; k <= id % 3; ++k) small.Add(id);
  }
  for (uint64_t id = 0; id < 200; ++id) {
    REQUIRE(small.Estimate(id) >= id % 3 + 1);
  }
}

TEST_CASE(
    "an id gets a row by its admit_count-th push; before, pulls read the "
    "initial values and gradients are dropped",
    "[admission]") {
  auto store = Store();
  TableSpec spec = Spec(EVICT_TTL, ADMIT_COUNT);
  spec.set_admit_count(3);
  REQUIRE_OK(CreateTable(store.get(), spec));
  std::vector<float> initial(kDim);
  RowInitializer(spec).Fill(5, initial.data());

  PulledRows pulled = *PullRows(store.get(), "emb", {5, 6});
  REQUIRE(std::vector<float>(pulled.values.begin(),
                             pulled.values.begin() + kDim) == initial);
  REQUIRE(pulled.versions[0] == 0);
  REQUIRE(store->tables().totals().rows == 0);  // a pull creates nothing

  for (int push = 1; push <= 2; ++push) {
    // Duplicates in one push count once.
    RowsResult r = *PushRows(store.get(), "emb", {5, 5}, Grads(2));
    REQUIRE(r.refused_admission() == 1);
    REQUIRE(r.applied() == 0);
    REQUIRE(r.rows_created() == 0);
  }
  REQUIRE(store->tables().totals().rows == 0);
  RowsResult third = *PushRows(store.get(), "emb", {5, 5}, Grads(2));
  REQUIRE(third.refused_admission() == 0);
  REQUIRE(third.rows_created() == 1);
  REQUIRE(third.applied() == 1);
  uint64_t version = 0;
  REQUIRE(Holds(*store, 5, &version));
  REQUIRE(version == 1);
  pulled = *PullRows(store.get(), "emb", {5});
  for (int d = 0; d < kDim; ++d) {
    REQUIRE(pulled.values[d] == initial[d] - 2.0f);  // lr 1, two grads
  }
  const TableStatus st = store->tables().Status()[0];
  REQUIRE(st.rows_admitted() == 1);
  REQUIRE(st.admission_refused() == 2);
  REQUIRE(st.rows_created() == 1);
  REQUIRE(st.admission() == ADMIT_COUNT);
  // The sketch counts against the budget.
  REQUIRE(st.bytes() == SparseTable::kTableOverheadBytes +
                            16u * 4 * AdmissionRule::kDefaultSketchWidth +
                            kRowBytes);
}

TEST_CASE("admission with probability p admits about p of the ids",
          "[admission]") {
  auto store = Store();
  TableSpec spec = Spec(EVICT_TTL, ADMIT_PROBABILITY);
  spec.set_admit_probability(0.25f);
  REQUIRE_OK(CreateTable(store.get(), spec));
  const std::vector<uint64_t> ids = Range(1, 4001);
  RowsResult r = *PushRows(store.get(), "emb", ids, Grads(ids.size()));
  INFO(r.rows_created());
  REQUIRE(r.rows_created() > 850);
  REQUIRE(r.rows_created() < 1150);
  REQUIRE(r.rows_created() + r.refused_admission() == ids.size());
  REQUIRE(r.applied() == r.rows_created());
}

TEST_CASE("bad admission and eviction specs are refused; nothing is created",
          "[admission][eviction]") {
  auto store = Store();
  auto refused = [&](const TableSpec& spec, const std::string& field) {
    absl::Status s = CreateTable(store.get(), spec);
    INFO(s.ToString());
    REQUIRE(absl::IsInvalidArgument(s));
    REQUIRE(s.message().find(field) != std::string::npos);
    REQUIRE(store->tables().Find("emb") == nullptr);
    REQUIRE(store->Size().reserved_bytes == 0);
  };
  TableSpec t = Spec(EVICT_TTL, ADMIT_COUNT);
  refused(t, "admit_count");  // 0
  t.set_admit_count(256);
  refused(t, "admit_count");
  for (float p : {0.0f, -0.5f, 1.5f, std::numeric_limits<float>::quiet_NaN()}) {
    TableSpec q = Spec(EVICT_TTL, ADMIT_PROBABILITY);
    q.set_admit_probability(p);
    refused(q, "admit_probability");
  }
  TableSpec w = Spec(EVICT_TTL, ADMIT_COUNT);
  w.set_admit_count(2);
  w.set_admit_sketch_width(1000);
  refused(w, "admit_sketch_width");
  TableSpec unset = Spec();
  unset.set_admit_count(2);  // without an admission policy
  refused(unset, "admit_count");
  TableSpec half = Spec(EVICT_LRU);
  half.set_lfu_half_life_steps(10);
  refused(half, "lfu_half_life_steps");
  TableSpec unknown = Spec();
  unknown.set_eviction(static_cast<EvictionPolicy>(9));
  refused(unknown, "eviction");
}

TEST_CASE(
    "a cap below an evicting table's minimum is RESOURCE_EXHAUSTED and "
    "creates nothing",
    "[eviction]") {
  const uint64_t minimum =
      SparseTable::kTableOverheadBytes + EvictionRule::kMinRows * kRowBytes;
  auto store = Store(minimum - 1);
  absl::Status s = CreateTable(store.get(), Spec(EVICT_LRU));
  INFO(s.ToString());
  REQUIRE(absl::IsResourceExhausted(s));
  REQUIRE(s.message().find("nothing was created") != std::string::npos);
  REQUIRE(store->tables().Find("emb") == nullptr);
  REQUIRE(store->Size().reserved_bytes == 0);
  auto enough = Store(minimum);
  REQUIRE_OK(CreateTable(enough.get(), Spec(EVICT_LRU)));
}

// Each step pushes the hot ids and `cold` fresh ids at clock `step`.
struct Churn {
  uint64_t cap = 0;
  uint64_t max_reserved = 0;
  uint64_t refused = 0;
};

Churn RunChurn(ShardStore* store, const std::vector<uint64_t>& hot, int steps,
               uint64_t cold) {
  Churn c;
  uint64_t next = 1000000;
  for (int step = 1; step <= steps; ++step) {
    std::vector<uint64_t> ids = hot;
    for (uint64_t i = 0; i < cold; ++i) ids.push_back(next++);
    absl::StatusOr<RowsResult> r =
        PushRows(store, "emb", ids, Grads(ids.size()), {}, {}, step);
    if (!r.ok()) {
      ++c.refused;
      continue;
    }
    c.max_reserved = std::max(c.max_reserved, store->Size().reserved_bytes);
  }
  return c;
}

TEST_CASE(
    "under the cap, LRU evicts cold rows and keeps a hot set touched every "
    "step; the cap is never exceeded",
    "[eviction][lru]") {
  const uint64_t cap = SparseTable::kTableOverheadBytes + 2000 * kRowBytes;
  auto store = Store(cap);
  REQUIRE_OK(CreateTable(store.get(), Spec(EVICT_LRU)));
  const std::vector<uint64_t> hot = Range(1, 101);
  const int steps = 60;
  const Churn c = RunChurn(store.get(), hot, steps, 300);  // 18000 cold ids
  REQUIRE(c.refused == 0);
  REQUIRE(c.max_reserved <= cap);
  for (uint64_t id : hot) {
    uint64_t version = 0;
    REQUIRE(Holds(*store, id, &version));
    REQUIRE(version == static_cast<uint64_t>(steps));  // never evicted
  }
  const TableStatus st = store->tables().Status()[0];
  REQUIRE(st.rows_evicted_cap() >= 18100 - 2000);
  REQUIRE(st.rows_evicted_idle() == 0);
  REQUIRE(st.rows_evicted() == st.rows_evicted_cap());
  REQUIRE(st.rows() <= 2000);
  INFO(st.rows() << " rows, reserved " << store->Size().reserved_bytes);
  REQUIRE(st.fill_ratio() > 0.9);
  REQUIRE(st.fill_ratio() <= 1.0);
  REQUIRE(st.eviction() == EVICT_LRU);
}

TEST_CASE(
    "evicting tables give up rows in proportion to what they hold: rows of "
    "tables fed at different rates live alike long",
    "[eviction][lru]") {
  const uint64_t cap = 2 * SparseTable::kTableOverheadBytes + 3000 * kRowBytes;
  auto store = Store(cap);
  TableSpec a = Spec(EVICT_LRU), b = Spec(EVICT_LRU);
  a.set_name("a");
  b.set_name("b");
  REQUIRE_OK(CreateTable(store.get(), a));
  REQUIRE_OK(CreateTable(store.get(), b));
  // "a" gets 2 fresh ids a step, "b" 1: about 12000 and 6000 in all.
  uint64_t next = 1;
  for (int step = 1; step <= 60; ++step) {
    for (const auto& [table, fresh] :
         {std::pair<std::string, int>{"a", 200}, {"b", 100}}) {
      std::vector<uint64_t> ids;
      for (int i = 0; i < fresh; ++i) ids.push_back(next++);
      REQUIRE_OK(
          PushRows(store.get(), table, ids, Grads(ids.size()), {}, {}, step)
              .status());
    }
    REQUIRE(store->Size().reserved_bytes <= cap);
  }
  uint64_t rows_a = 0, rows_b = 0;
  for (const TableStatus& t : store->tables().Status()) {
    REQUIRE(t.rows_evicted_cap() > 0);
    (t.name() == "a" ? rows_a : rows_b) = t.rows();
  }
  // The table holding most is not emptied first: both keep about the
  // same number of steps' rows (taking from the largest table alone
  // would leave them about even).
  INFO(rows_a << " rows of a, " << rows_b << " of b");
  REQUIRE(rows_a + rows_b > 2500);
  REQUIRE(rows_a > 1.6 * rows_b);
  REQUIRE(rows_a < 2.5 * rows_b);
}

TEST_CASE("without an eviction policy the same stream is refused at the cap",
          "[eviction]") {
  const uint64_t cap = SparseTable::kTableOverheadBytes + 2000 * kRowBytes;
  auto store = Store(cap);
  REQUIRE_OK(CreateTable(store.get(), Spec(EVICT_TTL)));
  const Churn c = RunChurn(store.get(), Range(1, 101), 60, 300);
  REQUIRE(c.refused > 0);
  REQUIRE(store->tables().Status()[0].rows_evicted() == 0);
}

TEST_CASE("LFU keeps rows used often even when they were not used lately",
          "[eviction][lfu]") {
  const uint64_t cap = SparseTable::kTableOverheadBytes + 2000 * kRowBytes;
  auto store = Store(cap);
  REQUIRE_OK(CreateTable(store.get(), Spec(EVICT_LFU)));
  const std::vector<uint64_t> often = Range(1, 201);
  for (int step = 0; step < 10; ++step) {
    REQUIRE_OK(
        PushRows(store.get(), "emb", often, Grads(often.size()), {}, {}, step)
            .status());
  }
  // Then only ids used once, long after: LRU would evict `often` first.
  const Churn c = RunChurn(store.get(), {}, 40, 200);
  REQUIRE(c.refused == 0);
  REQUIRE(c.max_reserved <= cap);
  for (uint64_t id : often) {
    uint64_t version = 0;
    REQUIRE(Holds(*store, id, &version));
    REQUIRE(version == 10);
  }
  REQUIRE(store->tables().Status()[0].rows_evicted_cap() > 0);
}

TEST_CASE(
    "an evicted row comes back initialized; gradients read before are "
    "refused as restored",
    "[eviction][lru]") {
  const uint64_t cap = SparseTable::kTableOverheadBytes + 1100 * kRowBytes;
  auto store = Store(cap);
  const TableSpec spec = Spec(EVICT_LRU);
  REQUIRE_OK(CreateTable(store.get(), spec));
  REQUIRE_OK(PushRows(store.get(), "emb", {7}, Grads(1), {}, {}, 0).status());
  REQUIRE_OK(PushRows(store.get(), "emb", {7}, Grads(1), {1}, {}, 0).status());
  uint64_t version = 0;
  REQUIRE(Holds(*store, 7, &version));
  REQUIRE(version == 2);
  // Newer rows push row 7 (last used at clock 0) out.
  REQUIRE(RunChurn(store.get(), {}, 10, 200).refused == 0);
  REQUIRE_FALSE(Holds(*store, 7, &version));
  // Read at version 2, before the eviction: refused, and the row is back
  // with its initial values.
  RowsResult r =
      *PushRows(store.get(), "emb", {7}, Grads(1, 5.0f), {2}, {}, 11);
  REQUIRE(r.refused_restored() == 1);
  REQUIRE(r.applied() == 0);
  PulledRows again = *PullRows(store.get(), "emb", {7}, 11);
  std::vector<float> initial(kDim);
  RowInitializer(spec).Fill(7, initial.data());
  REQUIRE(again.values == initial);
  REQUIRE(again.versions[0] == 0);
}

TEST_CASE("pulls make room too, and admission reserves only admitted rows",
          "[eviction][admission]") {
  const uint64_t fixed = SparseTable::kTableOverheadBytes +
                         16u * 4 * AdmissionRule::kDefaultSketchWidth;
  const uint64_t cap = fixed + 1500 * kRowBytes;
  auto store = Store(cap);
  TableSpec spec = Spec(EVICT_LRU, ADMIT_COUNT);
  spec.set_admit_count(2);
  REQUIRE_OK(CreateTable(store.get(), spec));
  // Each id pushed twice: the second push admits it.
  for (int step = 1; step <= 20; ++step) {
    const std::vector<uint64_t> ids = Range(step * 1000, step * 1000 + 200);
    for (int twice = 0; twice < 2; ++twice) {
      REQUIRE_OK(
          PushRows(store.get(), "emb", ids, Grads(ids.size()), {}, {}, step)
              .status());
    }
    REQUIRE(store->Size().reserved_bytes <= cap);
  }
  const TableStatus st = store->tables().Status()[0];
  REQUIRE(st.rows_admitted() == 4000);
  REQUIRE(st.admission_refused() == 4000);
  REQUIRE(st.rows_evicted_cap() >= 2500);

  auto plain = Store(SparseTable::kTableOverheadBytes + 1500 * kRowBytes);
  REQUIRE_OK(CreateTable(plain.get(), Spec(EVICT_LRU)));
  for (int step = 1; step <= 10; ++step) {
    REQUIRE_OK(PullRows(plain.get(), "emb",
                        Range(step * 1000, step * 1000 + 400), step)
                   .status());
  }
  REQUIRE(plain->tables().Status()[0].rows_evicted_cap() >= 2500);
}

}  // namespace
}  // namespace asyncps
