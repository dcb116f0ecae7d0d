// The state digest replicas compare: equal for equal states whatever order
// they were built or listed in, different when any value, version, row or
// worker record differs.

#include "server/state_digest.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <memory>
#include <vector>

#include "server/checkpoint.h"
#include "store/shard_store.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/table_helpers.h"

namespace asyncps {
namespace {

using testing::CreateTable;
using testing::IdsOn;
using testing::MakeTableSpec;
using testing::PushRows;

std::unique_ptr<ShardStore> Store() {
  ShardStoreOptions o;
  o.row_ttl_steps = 100;
  return ShardStore::Create(o).value();
}

OptimizerSpec Momentum() {
  OptimizerSpec o;
  o.set_type(OPT_MOMENTUM);
  o.set_learning_rate(0.1f);
  o.set_momentum(0.9f);
  return o;
}

// A table with `ids` pushed once each, in the given order.
std::unique_ptr<ShardStore> Filled(const std::vector<uint64_t>& ids,
                                   float grad) {
  auto store = Store();
  REQUIRE_OK(CreateTable(store.get(), MakeTableSpec("t", 4, Momentum())));
  for (uint64_t id : ids) {
    std::vector<float> g(4, grad + static_cast<float>(id % 5));
    REQUIRE_OK(PushRows(store.get(), "t", {id}, g, {}, {}, 3).status());
  }
  return store;
}

uint64_t Digest(const ShardStore& store,
                const std::vector<CheckpointWorker>& workers = {}) {
  return StateDigest(CaptureCheckpoint(store, workers, absl::Now()));
}

TEST_CASE("equal states have one digest whatever their order",
          "[replication][digest]") {
  std::vector<uint64_t> ids = IdsOn("t", 0, 1, 3000);
  const uint64_t forward = Digest(*Filled(ids, 1.0f));
  std::reverse(ids.begin(), ids.end());
  const uint64_t backward = Digest(*Filled(ids, 1.0f));
  CHECK(forward == backward);
  CHECK(forward != 0);
  // A capture at another time is the same state.
  auto store = Filled(ids, 1.0f);
  CHECK(Digest(*store) == Digest(*store));
}

TEST_CASE("a digest changes with any value, version, row or worker record",
          "[replication][digest]") {
  const std::vector<uint64_t> ids = IdsOn("t", 0, 1, 200);
  auto base = Filled(ids, 1.0f);
  const uint64_t d = Digest(*base);
  CHECK(Digest(*Filled(ids, 1.5f)) != d);  // values
  std::vector<uint64_t> fewer(ids.begin(), ids.end() - 1);
  CHECK(Digest(*Filled(fewer, 1.0f)) != d);  // one row fewer
  auto more = Filled(ids, 1.0f);
  std::vector<float> g(4, 0.0f);
  REQUIRE_OK(PushRows(more.get(), "t", {ids[0]}, g, {}, {}, 3).status());
  CHECK(Digest(*more) != d);  // a version (the zero gradient changed no value)

  CheckpointWorker w;
  w.set_worker_id(1);
  w.set_incarnation(7);
  w.set_dedup_base(10);
  w.add_dedup_applied(12);
  w.add_dedup_applied(14);
  CheckpointWorker same = w;
  same.clear_dedup_applied();
  same.add_dedup_applied(14);
  same.add_dedup_applied(12);
  CHECK(Digest(*base, {w}) == Digest(*base, {same}));  // a set, not a list
  CheckpointWorker other = w;
  other.add_dedup_applied(15);
  CHECK(Digest(*base, {w}) != Digest(*base, {other}));
  CHECK(Digest(*base, {w}) != d);
}

}  // namespace
}  // namespace asyncps
