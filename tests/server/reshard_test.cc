// Resharding a model's checkpoints (psctl reshard): 2 shards' files become
// 3 shards', then 1 shard's; restored, every layout holds bit-identical
// values, versions and optimizer state of every slice and row (SGD,
// momentum, Adam, Adagrad), the tensors only the spec files hold, the run
// id and the worker records. Inconsistent sets are refused.

#include "server/reshard.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/payload.h"
#include "common/shard_map.h"
#include "server/checkpoint.h"
#include "server/checkpoint_dir.h"
#include "server/checkpoint_lock.h"
#include "server/spec_file.h"
#include "server/starting_map.h"
#include "store/shard_store.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/store_helpers.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/table_helpers.h"
#include "tests/testing/tensor_specs.h"

namespace asyncps {
namespace {

constexpr char kRun[] = "run-7";

OptimizerSpec Optimizer(OptimizerType type) {
  return testing::AnyTypeSpec(type, 0.05f, 1e-8f);
}

TensorSpec Tensor(const std::string& name, std::vector<int64_t> shape,
                  OptimizerType type) {
  TensorSpec s;
  s.set_name(name);
  for (int64_t d : shape) s.add_shape(d);
  s.set_init(INIT_NORMAL);
  s.set_init_value(0.5f);
  s.set_seed(11);
  s.set_slice_elems(8);
  *s.mutable_optimizer() = Optimizer(type);
  return s;
}

std::vector<TensorSpec> Tensors() {
  return {Tensor("w_sgd", {9, 7}, OPT_SGD),
          Tensor("w_momentum", {5, 11}, OPT_MOMENTUM),
          Tensor("w_adam", {6, 6}, OPT_ADAM),
          Tensor("w_adagrad", {13}, OPT_ADAGRAD)};
}

TableSpec Table() {
  return testing::MakeTableSpec("emb", 4, Optimizer(OPT_ADAGRAD));
}

// Pushes a gradient to every local slice (read at its current version),
// a function of (round, tensor, slice).
void PushSlices(ShardStore* store, int round) {
  PullRequest pull;
  for (const TensorSpec& s : store->ListTensors()) pull.add_tensors(s.name());
  PullResponse pulled;
  REQUIRE_OK(store->Pull(pull, &pulled));
  PushRequest req;
  for (const SliceData& d : pulled.slices()) {
    SliceGradient* g = req.add_grads();
    g->set_tensor(d.tensor());
    g->set_slice(d.slice());
    g->set_read_version(d.version());
    std::vector<float> grad(d.values().size() / sizeof(float));
    for (size_t i = 0; i < grad.size(); ++i) {
      grad[i] = std::sin(0.37f * static_cast<float>(i + 1) + 1.3f * round +
                         0.11f * static_cast<float>(d.slice()));
    }
    EncodeFloats(grad.data(), grad.size(), g->mutable_grad());
  }
  PushResponse resp;
  REQUIRE_OK(testing::ApplyPush(store, req, StalenessRule{}, &resp));
}

CheckpointWorker Worker(int32_t id, uint64_t incarnation, int64_t clock,
                        int64_t trained, uint64_t seq) {
  CheckpointWorker w;
  w.set_worker_id(id);
  w.set_incarnation(incarnation);
  w.set_clock(clock);
  w.set_trained(trained);
  w.set_pushes(static_cast<uint64_t>(clock));
  w.set_dedup_base(seq);
  return w;
}

// Two trained shards' checkpoints and spec files; the spec files also hold
// a tensor created after the checkpoints ("late").
std::string WriteTwoShards() {
  const std::string dir = testing::MakeTmpDir("two");
  for (int shard = 0; shard < 2; ++shard) {
    ShardStoreOptions o;
    o.shard_index = shard;
    o.num_shards = 2;
    std::unique_ptr<ShardStore> store = ShardStore::Create(o).value();
    CreateTensorRequest create;
    for (const TensorSpec& t : Tensors()) *create.add_tensors() = t;
    *create.add_tables() = Table();
    REQUIRE_OK(store->CreateTensors(create).status());
    for (int round = 0; round < 3 + shard; ++round) {
      PushSlices(store.get(), round);
    }
    const std::vector<uint64_t> ids = testing::IdsOn("emb", shard, 2, 50);
    std::vector<float> grads(ids.size() * 4);
    for (size_t i = 0; i < grads.size(); ++i)
      grads[i] = 0.01f * (i % 7) - 0.03f;
    REQUIRE_OK(testing::PushRows(store.get(), "emb", ids, grads, {},
                                 StalenessRule(), /*clock=*/4)
                   .status());
    // Worker 0 pushed its 6th step to shard 0 and only its 5th to shard 1;
    // worker 1 restarted once in between (its old incarnation retired).
    std::vector<CheckpointWorker> workers = {
        Worker(0, 41, shard == 0 ? 6 : 5, shard == 0 ? 6 : 5, 6 - shard),
        Worker(1, 52, 3, 3, 2)};
    workers[1].add_retired_incarnations(51);
    workers[1].set_restarts(1);
    CheckpointImage image =
        CaptureCheckpoint(*store, workers, absl::Now(), "test", kRun);
    REQUIRE_OK(WriteCheckpoint(image, dir).status());
    SpecFileContents specs;
    specs.identity.set_shard_index(shard);
    specs.identity.set_num_shards(2);
    specs.identity.set_run_id(kRun);
    specs.tensors = store->ListTensors();
    specs.tensors.push_back(Tensor("late", {20}, OPT_MOMENTUM));
    specs.tables = store->tables().List();
    REQUIRE_OK(WriteSpecFile(SpecFilePath(dir, shard, 2), specs));
  }
  return dir;
}

// Everything a directory's shards hold after a restart, whatever their
// count: per slice its version, values and optimizer state; per row its
// version, last use, values and state; the worker records.
struct Model {
  std::map<std::pair<std::string, uint32_t>,
           std::tuple<uint64_t, std::string, std::string>>
      slices;
  std::map<std::pair<std::string, uint64_t>,
           std::tuple<uint64_t, int64_t, std::string, std::string>>
      rows;
  // id -> each shard's record (the old shards' differ; merged ones do not)
  std::map<int32_t, std::vector<std::string>> workers;
  std::string run;
};

std::string Floats(const float* p, size_t n) {
  return std::string(reinterpret_cast<const char*>(p), n * sizeof(float));
}

// The shards restore under the map their files name (static unless they
// name one), which must be `expected`'s when given.
Model Load(const std::string& dir, int shards,
           std::optional<ShardMap> expected = std::nullopt) {
  Model m;
  for (int shard = 0; shard < shards; ++shard) {
    ShardStoreOptions o;
    o.shard_index = shard;
    o.num_shards = shards;
    const absl::StatusOr<ShardMap> map =
        StartingShardMap({dir, true, shard, shards, 0, nullptr});
    REQUIRE_OK(map.status());
    if (expected.has_value()) CHECK(*map == *expected);
    o.map = *map;
    std::unique_ptr<ShardStore> store = ShardStore::Create(o).value();
    absl::StatusOr<RestoredCheckpoint> r =
        RestoreCheckpoint(CheckpointPath(dir, shard, shards), store.get());
    REQUIRE_OK(r.status());
    m.run = r->identity.run_id();
    for (const CheckpointWorker& w : r->workers) {
      m.workers[w.worker_id()].push_back(w.SerializeAsString());
    }
    absl::StatusOr<SpecFileContents> specs =
        ReadSpecFile(SpecFilePath(dir, shard, shards));
    REQUIRE_OK(specs.status());
    CHECK(specs->identity.run_id() == m.run);
    REQUIRE_OK(
        ApplySpecFile(*specs, SpecFilePath(dir, shard, shards), store.get())
            .status());
    std::string tensor;
    REQUIRE_OK(store->Export(
        [&](const TensorSpec& spec) {
          tensor = spec.name();
          return absl::OkStatus();
        },
        [&](const ShardStore::SliceView& v) {
          CHECK(map->SliceHome(tensor, v.index) == shard);
          std::string state;
          for (auto b : v.optimizer_state) state += Floats(b.data(), b.size());
          auto [it, fresh] = m.slices.emplace(
              std::make_pair(tensor, v.index),
              std::make_tuple(v.version,
                              Floats(v.values.data(), v.values.size()), state));
          CHECK(fresh);
          return absl::OkStatus();
        }));
    std::string table;
    REQUIRE_OK(store->tables().Export(
        [&](const TableSpec& spec) {
          table = spec.name();
          return absl::OkStatus();
        },
        [&](const SparseTable::RowView& r) {
          CHECK(map->RowHome(table, r.id) == shard);
          m.rows.emplace(
              std::make_pair(table, r.id),
              std::make_tuple(r.version, r.touched, Floats(r.values, r.dim),
                              Floats(r.state, r.state_floats)));
          return absl::OkStatus();
        }));
  }
  return m;
}

TEST_CASE(
    "reshard 2 -> 3 -> 1 keeps every value, version and state bit for "
    "bit",
    "[reshard]") {
  const std::string two = WriteTwoShards();
  const Model before = Load(two, 2);
  REQUIRE(before.slices.size() > 20);
  REQUIRE(before.rows.size() == 100);
  CHECK(before.slices.count({"late", 0}) == 1);

  const std::string three = testing::MakeTmpDir("three");
  absl::StatusOr<ReshardReport> r = Reshard({two, three + "/nested", 3});
  REQUIRE_OK(r.status());
  CHECK(r->run_id == kRun);
  CHECK(r->from_shards == 2);
  CHECK(r->to_shards == 3);
  CHECK(r->tensors == 5);
  CHECK(r->tables == 1);
  CHECK(r->rows == 100);
  CHECK(r->written.size() == 6);
  const Model mid = Load(three + "/nested", 3);

  const std::string one = testing::MakeTmpDir("one");
  REQUIRE_OK(Reshard({three + "/nested", one, 1}).status());
  const Model after = Load(one, 1);

  for (const Model* m : {&mid, &after}) {
    CHECK(m->run == kRun);
    CHECK(m->slices == before.slices);
    CHECK(m->rows == before.rows);
  }
  // The workers' records are merged: the furthest clock and data position,
  // the replaced incarnation still fenced, seen pushes settled.
  for (const Model* m : {&mid, &after}) {
    REQUIRE(m->workers.size() == 2);
    for (const auto& [id, records] : m->workers) {
      for (const std::string& r : records) CHECK(r == records[0]);
    }
  }
  CheckpointWorker w0, w1;
  REQUIRE(w0.ParseFromString(after.workers.at(0)[0]));
  REQUIRE(w1.ParseFromString(after.workers.at(1)[0]));
  CHECK(w0.incarnation() == 41);
  CHECK(w0.clock() == 6);
  CHECK(w0.trained() == 6);
  CHECK(w0.dedup_base() == 6);
  CHECK(w1.incarnation() == 52);
  CHECK(w1.restarts() == 1);
  REQUIRE(w1.retired_incarnations_size() == 1);
  CHECK(w1.retired_incarnations(0) == 51);
  // The new files are what a shard of the new count may use.
  REQUIRE_OK(CheckCheckpointDir({one, 0, 1, kRun, "", true}));
}

TEST_CASE(
    "reshard onto slotted maps (even, then moved slots) and back keeps every "
    "value bit for bit",
    "[reshard][slots]") {
  const std::string two = WriteTwoShards();
  const Model before = Load(two, 2);

  // 2 static shards -> 3 shards of 64 slots spread evenly.
  const std::string even = testing::MakeTmpDir("even");
  ReshardOptions o{two, even, 3};
  o.num_slots = 64;
  REQUIRE_OK(Reshard(o).status());
  const Model on_even = Load(even, 3, *ShardMap::EvenSlots(3, 64));

  // -> a map that moved slots (shard 2 owns half of them), as psctl
  // rebalance writes one.
  std::vector<uint16_t> owners(64);
  for (int s = 0; s < 64; ++s) owners[s] = s < 32 ? 2 : s % 2;
  const ShardMap moved = *ShardMap::Slotted(3, owners, 2);
  const std::string rebalanced = testing::MakeTmpDir("rebalanced");
  ReshardOptions m{even, rebalanced, 3};
  m.map = moved;
  REQUIRE_OK(Reshard(m).status());
  const Model on_moved = Load(rebalanced, 3, moved);

  // -> back to 2 static shards.
  const std::string back = testing::MakeTmpDir("back");
  REQUIRE_OK(Reshard({rebalanced, back, 2}).status());
  const Model after = Load(back, 2, *ShardMap::Static(2));

  for (const Model* model : {&on_even, &on_moved, &after}) {
    CHECK(model->run == kRun);
    CHECK(model->slices == before.slices);
    CHECK(model->rows == before.rows);
    REQUIRE(model->workers.size() == 2);
    for (const auto& [id, records] : model->workers) {
      for (const std::string& r : records) CHECK(r == after.workers.at(id)[0]);
    }
  }

  // A shard serving another map refuses the files, saying which maps.
  ShardStoreOptions wrong;
  wrong.shard_index = 0;
  wrong.num_shards = 3;
  wrong.map = *ShardMap::EvenSlots(3, 64);
  std::unique_ptr<ShardStore> store = ShardStore::Create(wrong).value();
  absl::StatusOr<RestoredCheckpoint> r =
      RestoreCheckpoint(CheckpointPath(rebalanced, 0, 3), store.get());
  CHECK(absl::IsFailedPrecondition(r.status()));
  CHECK(absl::StrContains(r.status().message(),
                          "map of 64 slots over 3 shards, epoch 2"));

  // A map file of another shard count is refused before anything is read.
  ReshardOptions bad{even, testing::MakeTmpDir("bad"), 4};
  bad.map = moved;
  CHECK(absl::IsInvalidArgument(Reshard(bad).status()));
}

TEST_CASE("a starting shard serves its files' map; flags that disagree fail",
          "[reshard][slots]") {
  const std::string two = WriteTwoShards();  // static map of 2
  const auto start = [](const std::string& dir, int num_shards, int slots) {
    return StartingShardMap({dir, true, 0, num_shards, slots, nullptr});
  };
  // Static files: as they are, or slotted in place when 2 divides S.
  CHECK(*start(two, 2, 0) == *ShardMap::Static(2));
  CHECK(*start(two, 2, 64) == *ShardMap::EvenSlots(2, 64));
  CHECK(absl::IsFailedPrecondition(start(two, 2, 63).status()));
  // Slotted files: their map whatever --num_slots says, unless another
  // slot count.
  const std::string even = testing::MakeTmpDir("even");
  ReshardOptions o{two, even, 3};
  o.num_slots = 64;
  REQUIRE_OK(Reshard(o).status());
  CHECK(*start(even, 3, 0) == *ShardMap::EvenSlots(3, 64));
  CHECK(*start(even, 3, 64) == *ShardMap::EvenSlots(3, 64));
  const absl::StatusOr<ShardMap> other = start(even, 3, 128);
  CHECK(absl::IsFailedPrecondition(other.status()));
  CHECK(absl::StrContains(other.status().message(), "--num_slots=64"));
  // No files: the flags' map; a bad slot count is INVALID_ARGUMENT.
  const std::string empty = testing::MakeTmpDir("empty");
  CHECK(*start(empty, 3, 0) == *ShardMap::Static(3));
  CHECK(*start(empty, 3, 96) == *ShardMap::EvenSlots(3, 96));
  CHECK(absl::IsInvalidArgument(start(empty, 3, 2).status()));
  // restore off: the files are ignored.
  CHECK(*StartingShardMap({even, false, 0, 3, 0, nullptr}) ==
        *ShardMap::Static(3));
}

TEST_CASE("reshard refuses incomplete, mixed, occupied or locked directories",
          "[reshard]") {
  const std::string two = WriteTwoShards();
  SECTION("another shard count in the source") {
    const std::string mixed = WriteTwoShards();
    SpecFileContents stray;
    stray.identity.set_num_shards(3);
    stray.identity.set_run_id(kRun);
    REQUIRE_OK(WriteSpecFile(SpecFilePath(mixed, 2, 3), stray));
    absl::StatusOr<ReshardReport> r =
        Reshard({mixed, testing::MakeTmpDir("out"), 4});
    CHECK(absl::IsFailedPrecondition(r.status()));
    CHECK(absl::StrContains(r.status().message(), "shard-2-of-3.specs"));
  }
  SECTION("a shard's files missing") {
    REQUIRE(std::remove(CheckpointPath(two, 1, 2).c_str()) == 0);
    REQUIRE(std::remove(SpecFilePath(two, 1, 2).c_str()) == 0);
    absl::StatusOr<ReshardReport> r =
        Reshard({two, testing::MakeTmpDir("out"), 4});
    CHECK(absl::IsFailedPrecondition(r.status()));
    CHECK(absl::StrContains(r.status().message(), "shard 1 of 2"));
  }
  SECTION("files of two runs") {
    SpecFileContents other;
    other.identity.set_shard_index(1);
    other.identity.set_num_shards(2);
    other.identity.set_run_id("run-8");
    other.tensors = Tensors();
    REQUIRE_OK(WriteSpecFile(SpecFilePath(two, 1, 2), other));
    absl::StatusOr<ReshardReport> r =
        Reshard({two, testing::MakeTmpDir("out"), 4});
    CHECK(absl::IsFailedPrecondition(r.status()));
    CHECK(absl::StrContains(r.status().message(), "run-8"));
  }
  SECTION("a target that holds shard files") {
    absl::StatusOr<ReshardReport> r = Reshard({two, WriteTwoShards(), 4});
    CHECK(absl::IsFailedPrecondition(r.status()));
    CHECK(absl::StrContains(r.status().message(), "new directory"));
  }
  SECTION("a shard process running on either directory") {
    const std::string out = testing::MakeTmpDir("out") + "/new";
    // As a ps_server holds them (server/checkpoint_lock.h).
    const bool source = GENERATE(true, false);
    absl::StatusOr<std::unique_ptr<CheckpointLock>> held =
        source ? CheckpointLock::Acquire(two, 1, 2, {})
               : CheckpointLock::Acquire(out, 2, 4, {});
    REQUIRE_OK(held.status());
    absl::StatusOr<ReshardReport> r = Reshard({two, out, 4});
    INFO(r.status());
    CHECK(absl::IsFailedPrecondition(r.status()));
    CHECK(absl::StrContains(r.status().message(),
                            source ? "shard 1 of 2" : "shard 2 of 4"));
    CHECK(absl::StrContains(r.status().message(),
                            absl::StrCat("in use by process ", getpid())));
    CHECK(absl::StrContains(r.status().message(), "a stopped run's files"));
    absl::StatusOr<std::vector<ShardFile>> written = ListShardFiles(out);
    REQUIRE_OK(written.status());
    CHECK(written->empty());
    // Once the process is gone (its lock with it), the same reshard runs.
    held->reset();
    REQUIRE_OK(Reshard({two, out, 4}).status());
  }
  SECTION("bad arguments") {
    CHECK(absl::IsInvalidArgument(Reshard({two, two, 3}).status()));
    CHECK(absl::IsInvalidArgument(
        Reshard({two, testing::MakeTmpDir("out"), 0}).status()));
  }
}

}  // namespace
}  // namespace asyncps
