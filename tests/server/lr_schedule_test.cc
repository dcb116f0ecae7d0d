// Learning-rate schedules (SetLearningRate): the rules for concurrent
// setters, the rate each push is applied with on dense slices and sparse
// rows, and that a schedule survives checkpoints, spec files and specs
// compared at re-creation.

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "server/checkpoint.h"
#include "server/spec_file.h"
#include "store/shard_store.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/store_helpers.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/table_helpers.h"
#include "tests/testing/tensor_specs.h"

namespace asyncps {
namespace {

std::unique_ptr<ShardStore> Store() {
  ShardStoreOptions o;
  o.shard_index = 0;
  o.num_shards = 1;
  return ShardStore::Create(o).value();
}

// w: 4 elements at 1.0, SGD lr 0.5; emb: 2-dim table at 1.0, SGD lr 0.5.
void CreateModel(ShardStore* store) {
  CreateTensorRequest req;
  *req.add_tensors() =
      testing::ConstantSpec("w", {4}, 1.0f, testing::SgdSpec(0.5f), 4);
  *req.add_tables() = testing::MakeTableSpec("emb", 2, testing::SgdSpec(0.5f),
                                             INIT_CONSTANT, 1.0f);
  REQUIRE_OK(store->CreateTensors(req).status());
}

SetLearningRateRequest Rates(
    std::vector<std::tuple<std::string, float, int64_t>> rates) {
  SetLearningRateRequest req;
  for (const auto& [name, lr, step] : rates) {
    LearningRate* r = req.add_rates();
    r->set_name(name);
    r->set_learning_rate(lr);
    r->set_step(step);
  }
  return req;
}

absl::StatusOr<SetLearningRateResponse> Set(
    ShardStore* store,
    std::vector<std::tuple<std::string, float, int64_t>> rates,
    bool* changed = nullptr) {
  bool ignored = false;
  return store->SetLearningRates(Rates(std::move(rates)),
                                 changed != nullptr ? changed : &ignored);
}

// w after one push of gradient 1 everywhere (read at its current version).
float PushDenseOnce(ShardStore* store) {
  PullRequest pull;
  pull.add_tensors("w");
  PullResponse before;
  REQUIRE_OK(store->Pull(pull, &before));
  PushRequest push;
  SliceGradient* g = push.add_grads();
  g->set_tensor("w");
  g->set_slice(0);
  g->set_read_version(before.slices(0).version());
  const std::vector<float> ones(4, 1.0f);
  EncodeFloats(ones.data(), ones.size(), g->mutable_grad());
  PushResponse resp;
  REQUIRE_OK(testing::ApplyPush(store, push, StalenessRule(), &resp));
  PullResponse after;
  REQUIRE_OK(store->Pull(pull, &after));
  float v = 0;
  DecodeFloats(after.slices(0).values(), &v, 1);
  return v;
}

// Row 7 of emb after one push of gradient 1.
float PushRowOnce(ShardStore* store) {
  absl::StatusOr<testing::PulledRows> read =
      testing::PullRows(store, "emb", {7});
  REQUIRE_OK(read.status());
  REQUIRE_OK(testing::PushRows(store, "emb", {7}, {1.0f, 1.0f}, read->versions)
                 .status());
  absl::StatusOr<testing::PulledRows> after =
      testing::PullRows(store, "emb", {7});
  REQUIRE_OK(after.status());
  return after->values[0];
}

TEST_CASE("a schedule step changes the rate pushes are applied with",
          "[lr_schedule]") {
  auto store = Store();
  CreateModel(store.get());
  CHECK(PushDenseOnce(store.get()) == 0.5f);  // 1 - 0.5
  CHECK(PushRowOnce(store.get()) == 0.5f);
  bool changed = false;
  absl::StatusOr<SetLearningRateResponse> r =
      Set(store.get(), {{"w", 0.125f, 1}, {"emb", 0.25f, 1}}, &changed);
  REQUIRE_OK(r.status());
  CHECK(changed);
  REQUIRE(r->rates_size() == 2);
  CHECK(r->rates(0).name() == "w");
  CHECK(r->rates(0).learning_rate() == 0.125f);
  CHECK(r->rates(1).step() == 1);
  CHECK(PushDenseOnce(store.get()) == 0.375f);  // 0.5 - 0.125
  CHECK(PushRowOnce(store.get()) == 0.25f);     // 0.5 - 0.25

  // Listed with the schedule; the created rate is still the spec's.
  std::vector<TensorSpec> listed = store->ListTensors();
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].optimizer().learning_rate() == 0.5f);
  CHECK(listed[0].optimizer().scheduled_learning_rate() == 0.125f);
  CHECK(listed[0].optimizer().schedule_step() == 1);
  std::vector<LearningRate> rates = store->LearningRates();
  REQUIRE(rates.size() == 2);
  CHECK(rates[0].name() == "emb");
  CHECK(rates[1].name() == "w");

  // A worker re-creating the tensor with the created spec matches it.
  CreateTensorRequest again;
  *again.add_tensors() =
      testing::ConstantSpec("w", {4}, 1.0f, testing::SgdSpec(0.5f), 4);
  REQUIRE_OK(store->CreateTensors(again).status());
  // A spec that carries a schedule is not a creation.
  again.mutable_tensors(0)->mutable_optimizer()->set_schedule_step(3);
  CHECK(absl::IsInvalidArgument(store->CreateTensors(again).status()));
}

TEST_CASE("concurrent setters agree on (step, rate)", "[lr_schedule]") {
  auto store = Store();
  CreateModel(store.get());
  REQUIRE_OK(Set(store.get(), {{"w", 0.25f, 2}}).status());

  // The same step and rate again (another worker, a retry): no change.
  bool changed = true;
  REQUIRE_OK(Set(store.get(), {{"w", 0.25f, 2}}, &changed).status());
  CHECK_FALSE(changed);

  // The same step with another rate: the workers disagree.
  absl::StatusOr<SetLearningRateResponse> r =
      Set(store.get(), {{"w", 0.3f, 2}});
  CHECK(absl::IsAlreadyExists(r.status()));
  CHECK(absl::StrContains(r.status().message(), "0.25 on the shard, 0.3"));

  // An earlier step (a slower worker): no change, the later rate shown.
  r = Set(store.get(), {{"w", 0.4f, 1}}, &changed);
  REQUIRE_OK(r.status());
  CHECK_FALSE(changed);
  CHECK(r->rates(0).learning_rate() == 0.25f);
  CHECK(r->rates(0).step() == 2);
  CHECK(PushDenseOnce(store.get()) == 0.75f);  // 1 - 0.25

  SECTION("bad requests change nothing") {
    // One bad entry refuses the whole request, also the good one before it.
    CHECK(absl::IsNotFound(
        Set(store.get(), {{"w", 0.01f, 5}, {"nope", 0.1f, 5}}).status()));
    CHECK(absl::IsInvalidArgument(
        Set(store.get(), {{"w", 0.01f, 5}, {"emb", -1.0f, 5}}).status()));
    CHECK(absl::IsInvalidArgument(
        Set(store.get(), {{"w", 0.01f, 5}, {"emb", NAN, 5}}).status()));
    CHECK(
        absl::IsInvalidArgument(Set(store.get(), {{"w", 0.01f, 0}}).status()));
    CHECK(absl::IsInvalidArgument(
        Set(store.get(), {{"w", 0.01f, 5}, {"w", 0.01f, 5}}).status()));
    std::vector<LearningRate> rates = store->LearningRates();
    REQUIRE(rates.size() == 1);
    CHECK(rates[0].step() == 2);
    CHECK(rates[0].learning_rate() == 0.25f);
  }
}

TEST_CASE("a schedule survives checkpoints and spec files", "[lr_schedule]") {
  const std::string dir = testing::MakeTmpDir("lr_schedule");
  auto store = Store();
  CreateModel(store.get());
  REQUIRE_OK(Set(store.get(), {{"w", 0.125f, 3}, {"emb", 0.25f, 3}}).status());
  REQUIRE_OK(testing::WriteStoreCheckpoint(*store, dir).status());

  auto restored = Store();
  REQUIRE_OK(
      testing::RestoreStoreCheckpoint(CheckpointPath(dir, 0, 1), restored.get())
          .status());
  std::vector<LearningRate> rates = restored->LearningRates();
  REQUIRE(rates.size() == 2);
  CHECK(rates[1].learning_rate() == 0.125f);
  CHECK(rates[1].step() == 3);
  CHECK(PushDenseOnce(restored.get()) == 0.875f);
  CHECK(PushRowOnce(restored.get()) == 0.75f);

  // A later step made durable only in the spec file (after the
  // checkpoint) wins over the checkpoint's; the journal wrote it because
  // the schedule advanced.
  CheckpointIdentity id;
  id.set_num_shards(1);
  SpecJournal journal(SpecFilePath(dir, 0, 1), id, store.get());
  REQUIRE_OK(journal.Sync());
  REQUIRE_OK(Set(store.get(), {{"w", 0.0625f, 4}}).status());
  REQUIRE_OK(journal.Sync());
  absl::StatusOr<SpecFileContents> specs =
      ReadSpecFile(SpecFilePath(dir, 0, 1));
  REQUIRE_OK(specs.status());
  auto again = Store();
  REQUIRE_OK(
      testing::RestoreStoreCheckpoint(CheckpointPath(dir, 0, 1), again.get())
          .status());
  REQUIRE_OK(
      ApplySpecFile(*specs, SpecFilePath(dir, 0, 1), again.get()).status());
  rates = again->LearningRates();
  REQUIRE(rates.size() == 2);
  CHECK(rates[0].step() == 3);  // emb: as checkpointed
  CHECK(rates[1].step() == 4);  // w: the spec file's later step
  CHECK(rates[1].learning_rate() == 0.0625f);

  // A fresh store from the spec file alone (no checkpoint) has the
  // schedule too.
  auto fresh = Store();
  absl::StatusOr<int> created =
      ApplySpecFile(*specs, SpecFilePath(dir, 0, 1), fresh.get());
  REQUIRE_OK(created.status());
  CHECK(*created == 2);
  CHECK(PushDenseOnce(fresh.get()) == 0.9375f);  // 1 - 0.0625
}

}  // namespace
}  // namespace asyncps
