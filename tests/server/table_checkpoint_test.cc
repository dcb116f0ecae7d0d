// Checkpoints of sparse tables: rows, versions, optimizer state and last-use
// clocks come back exactly; the counts are checked; restores respect the
// memory cap.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "common/shard_map.h"
#include "server/checkpoint.h"
#include "store/shard_store.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/store_helpers.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/table_helpers.h"

namespace asyncps {
namespace {

using testing::CreateTable;
using testing::IdsOn;
using testing::MakeTableSpec;
using testing::PulledRows;
using testing::PullRows;
using testing::PushRows;

OptimizerSpec Adam() { return testing::AdamSpec(); }
OptimizerSpec Adagrad() { return testing::AdagradSpec(); }

std::unique_ptr<ShardStore> Store(int shard, int shards, uint64_t cap = 0) {
  ShardStoreOptions o;
  o.shard_index = shard;
  o.num_shards = shards;
  o.max_parameter_bytes = cap;
  o.row_ttl_steps = 100;
  return ShardStore::Create(o).value();
}

std::string FreshDir(const std::string& stem) {
  const std::string dir = testing::UniqueTmpPath(stem);
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

// Fills two tables (and a dense tensor) on shard 1 of 2 with rows that have
// seen a few updates.
void Fill(ShardStore* store, std::vector<uint64_t>* a_ids,
          std::vector<uint64_t>* b_ids) {
  REQUIRE_OK(CreateTable(store, MakeTableSpec("a", 8, Adam())));
  REQUIRE_OK(CreateTable(store, MakeTableSpec("b", 3, Adagrad())));
  CreateTensorRequest dense;
  TensorSpec* t = dense.add_tensors();
  t->set_name("w");
  t->add_shape(10);
  t->mutable_optimizer()->set_learning_rate(0.1f);
  REQUIRE_OK(store->CreateTensors(dense).status());
  // More rows than one record holds.
  *a_ids = IdsOn("a", 1, 2, 5000);
  *b_ids = IdsOn("b", 1, 2, 50);
  for (int step = 0; step < 3; ++step) {
    std::vector<float> ga(a_ids->size() * 8), gb(b_ids->size() * 3);
    for (size_t i = 0; i < ga.size(); ++i) ga[i] = 0.001f * (i % 97) - step;
    for (size_t i = 0; i < gb.size(); ++i) gb[i] = 0.01f * (i % 7) + step;
    REQUIRE_OK(PushRows(store, "a", *a_ids, ga, {}, {}, 10 + step).status());
    REQUIRE_OK(PushRows(store, "b", *b_ids, gb, {}, {}, 10 + step).status());
  }
}

TEST_CASE("a checkpoint restores tables exactly", "[tables][checkpoint]") {
  const std::string dir = FreshDir("tables");
  auto store = Store(1, 2);
  std::vector<uint64_t> a_ids, b_ids;
  Fill(store.get(), &a_ids, &b_ids);
  absl::StatusOr<CheckpointInfo> written =
      testing::WriteStoreCheckpoint(*store, dir);
  REQUIRE_OK(written.status());
  REQUIRE(written->tables() == 2);
  REQUIRE(written->rows() == a_ids.size() + b_ids.size());

  auto restored = Store(1, 2);
  absl::StatusOr<CheckpointInfo> info = testing::RestoreStoreCheckpoint(
      CheckpointPath(dir, 1, 2), restored.get());
  REQUIRE_OK(info.status());
  REQUIRE(info->tables() == 2);
  REQUIRE(info->rows() == a_ids.size() + b_ids.size());
  REQUIRE(restored->tables().List().size() == 2);
  REQUIRE(restored->Size().reserved_bytes == store->Size().reserved_bytes);

  // Values and versions, and (through one more identical push to both) the
  // optimizer state.
  for (const auto& [name, ids, dim] :
       {std::make_tuple("a", a_ids, 8), std::make_tuple("b", b_ids, 3)}) {
    std::vector<float> g(ids.size() * dim, 0.25f);
    REQUIRE_OK(PushRows(store.get(), name, ids, g, {}, {}, 20).status());
    REQUIRE_OK(PushRows(restored.get(), name, ids, g, {}, {}, 20).status());
    const PulledRows x = *PullRows(store.get(), name, ids, 20);
    const PulledRows y = *PullRows(restored.get(), name, ids, 20);
    REQUIRE(x.values == y.values);
    REQUIRE(x.versions == y.versions);
    REQUIRE(x.versions[0] == 4);
  }
  // Last-use clocks came back: at clock 105 rows last used before 5 would
  // go; none did.
  REQUIRE(restored->tables().EvictIdle(105) == 0);
  REQUIRE(restored->tables().EvictIdle(125) == a_ids.size() + b_ids.size());
}

TEST_CASE("restoring tables refuses a non-empty store and respects the cap",
          "[tables][checkpoint]") {
  const std::string dir = FreshDir("tables_cap");
  auto store = Store(1, 2);
  std::vector<uint64_t> a_ids, b_ids;
  Fill(store.get(), &a_ids, &b_ids);
  REQUIRE_OK(testing::WriteStoreCheckpoint(*store, dir).status());
  const std::string path = CheckpointPath(dir, 1, 2);

  auto busy = Store(1, 2);
  REQUIRE_OK(CreateTable(busy.get(), MakeTableSpec("x", 2, Adagrad())));
  REQUIRE(absl::IsFailedPrecondition(
      testing::RestoreStoreCheckpoint(path, busy.get()).status()));

  auto small = Store(1, 2, store->Size().reserved_bytes / 2);
  const absl::Status s =
      testing::RestoreStoreCheckpoint(path, small.get()).status();
  INFO(s.ToString());
  REQUIRE(absl::IsResourceExhausted(s));
  REQUIRE(s.message().find(path) != std::string::npos);

  // Another shard's file is refused.
  auto other = Store(0, 2);
  REQUIRE(absl::IsFailedPrecondition(
      testing::RestoreStoreCheckpoint(path, other.get()).status()));
}

}  // namespace
}  // namespace asyncps
