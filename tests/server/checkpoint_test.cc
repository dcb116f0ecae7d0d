// Checkpoint files of a ShardStore: exact round trips (values, versions and
// optimizer state continue bit for bit), corruption and truncation are
// DATA_LOSS, another shard's file is FAILED_PRECONDITION, a leftover .tmp is
// ignored, and a checkpoint taken during pushes holds consistent slices.

#include "server/checkpoint.h"

#include <sys/stat.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/payload.h"
#include "store/shard_store.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/store_helpers.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

constexpr int kShards = 2;
constexpr int kShard = 1;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

std::unique_ptr<ShardStore> Store(int shard = kShard, int shards = kShards) {
  ShardStoreOptions o;
  o.shard_index = shard;
  o.num_shards = shards;
  o.default_slice_elems = 8;
  return ShardStore::Create(o).value();
}

TensorSpec Spec(const std::string& name, std::vector<int64_t> shape,
                OptimizerType type) {
  TensorSpec s;
  s.set_name(name);
  for (int64_t d : shape) s.add_shape(d);
  s.set_init(INIT_NORMAL);
  s.set_init_value(0.5f);
  s.set_seed(7);
  OptimizerSpec* o = s.mutable_optimizer();
  o->set_type(type);
  o->set_learning_rate(0.05f);
  o->set_momentum(0.9f);
  o->set_beta1(0.9f);
  o->set_beta2(0.999f);
  o->set_epsilon(1e-8f);
  return s;
}

// One SGD, one momentum and one Adam tensor, slices on both shards.
std::vector<TensorSpec> Specs() {
  return {Spec("w_sgd", {9, 7}, OPT_SGD),
          Spec("w_momentum", {5, 11}, OPT_MOMENTUM),
          Spec("w_adam", {6, 6}, OPT_ADAM), Spec("bias", {3}, OPT_ADAM)};
}

void CreateAll(ShardStore* store) {
  CreateTensorRequest req;
  for (const TensorSpec& s : Specs()) *req.add_tensors() = s;
  REQUIRE(store->CreateTensors(req).ok());
}

// (tensor, slice) -> (version, values bytes) for every local slice.
using Snapshot = std::map<std::pair<std::string, uint32_t>,
                          std::pair<uint64_t, std::string>>;

Snapshot Take(ShardStore* store) {
  PullRequest req;
  for (const TensorSpec& s : store->ListTensors()) req.add_tensors(s.name());
  PullResponse resp;
  REQUIRE_OK(store->Pull(req, &resp));
  Snapshot out;
  for (const SliceData& d : resp.slices()) {
    out[{d.tensor(), d.slice()}] = {d.version(), d.values()};
  }
  return out;
}

// Pushes a gradient to every local slice of every tensor, reading the
// current versions; the gradient is a function of (round, tensor, slice).
void PushRound(ShardStore* store, int round) {
  PushRequest req;
  for (const auto& [key, slice] : Take(store)) {
    SliceGradient* g = req.add_grads();
    g->set_tensor(key.first);
    g->set_slice(key.second);
    g->set_read_version(slice.first);
    std::vector<float> grad(slice.second.size() / sizeof(float));
    for (size_t i = 0; i < grad.size(); ++i) {
      grad[i] = std::sin(0.37f * static_cast<float>(i + 1) +
                         1.3f * static_cast<float>(round) +
                         0.11f * static_cast<float>(key.second)) +
                0.01f * static_cast<float>(key.first.size());
    }
    EncodeFloats(grad.data(), grad.size(), g->mutable_grad());
  }
  PushResponse resp;
  REQUIRE_OK(testing::ApplyPush(store, req, StalenessRule{}, &resp));
  for (const SliceResult& r : resp.results()) REQUIRE(r.outcome() == APPLIED);
}

// A trained store and its checkpoint in a fresh directory.
struct Saved {
  std::unique_ptr<ShardStore> store;
  std::string dir;
  std::string path;
};

Saved TrainAndSave(int rounds = 3) {
  Saved s;
  s.store = Store();
  CreateAll(s.store.get());
  for (int r = 0; r < rounds; ++r) PushRound(s.store.get(), r);
  s.dir = testing::MakeTmpDir("ckpt");
  absl::StatusOr<CheckpointInfo> info =
      testing::WriteStoreCheckpoint(*s.store, s.dir, "t");
  REQUIRE_OK(info.status());
  s.path = info->path();
  REQUIRE(s.path == CheckpointPath(s.dir, kShard, kShards));
  return s;
}

TEST_CASE("restore continues SGD, momentum and Adam bit for bit",
          "[checkpoint]") {
  Saved saved = TrainAndSave();
  const Snapshot before = Take(saved.store.get());
  REQUIRE(before.size() > 4);
  for (const auto& [key, slice] : before) REQUIRE(slice.first == 3);

  std::unique_ptr<ShardStore> restored = Store();
  absl::StatusOr<CheckpointInfo> info =
      testing::RestoreStoreCheckpoint(saved.path, restored.get());
  REQUIRE_OK(info.status());
  CHECK(info->tensors() == 4);
  CHECK(info->slices() == static_cast<int32_t>(before.size()));
  CHECK(info->bytes() == ReadFile(saved.path).size());

  // Same specs, same values and versions.
  std::map<std::string, std::string> specs_a, specs_b;
  for (const TensorSpec& s : saved.store->ListTensors()) {
    specs_a[s.name()] = s.SerializeAsString();
  }
  for (const TensorSpec& s : restored->ListTensors()) {
    specs_b[s.name()] = s.SerializeAsString();
  }
  CHECK(specs_a == specs_b);
  REQUIRE(Take(restored.get()) == before);

  // The optimizer state came along: the same gradients give the same bits
  // as on the store that never stopped (momentum and Adam would differ with
  // fresh state, Adam also with a reset step count).
  for (int r = 3; r < 6; ++r) {
    PushRound(saved.store.get(), r);
    PushRound(restored.get(), r);
  }
  const Snapshot after = Take(saved.store.get());
  CHECK(after != before);
  CHECK(Take(restored.get()) == after);

  // Control: the same values and versions with zeroed optimizer state
  // continue differently for momentum and Adam (and identically for SGD),
  // so the comparison above does test the state.
  std::unique_ptr<ShardStore> stateless = Store();
  std::map<std::string, int> buffers;
  for (const TensorSpec& spec : saved.store->ListTensors()) {
    REQUIRE_OK(stateless->RestoreTensor(spec));
    buffers[spec.name()] = spec.optimizer().type() == OPT_SGD        ? 0
                           : spec.optimizer().type() == OPT_MOMENTUM ? 1
                                                                     : 2;
  }
  for (const auto& [key, slice] : before) {
    const std::string zeros(slice.second.size(), '\0');
    const std::vector<absl::string_view> state(buffers[key.first], zeros);
    REQUIRE_OK(stateless->RestoreSlice(key.first, key.second, slice.first,
                                       slice.second, state));
  }
  REQUIRE(Take(stateless.get()) == before);
  for (int r = 3; r < 6; ++r) PushRound(stateless.get(), r);
  for (const auto& [key, slice] : Take(stateless.get())) {
    INFO(key.first << " slice " << key.second);
    CHECK((slice == after.at(key)) == (key.first == "w_sgd"));
  }
}

TEST_CASE("an empty store round-trips", "[checkpoint]") {
  std::unique_ptr<ShardStore> store = Store();
  const std::string dir = testing::MakeTmpDir("empty");
  absl::StatusOr<CheckpointInfo> info =
      testing::WriteStoreCheckpoint(*store, dir);
  REQUIRE_OK(info.status());
  CHECK(info->tensors() == 0);
  std::unique_ptr<ShardStore> restored = Store();
  REQUIRE_OK(
      testing::RestoreStoreCheckpoint(info->path(), restored.get()).status());
  CHECK(restored->Size().tensors == 0);
}

TEST_CASE("every corrupt byte is DATA_LOSS naming the file", "[checkpoint]") {
  Saved saved = TrainAndSave();
  const std::string good = ReadFile(saved.path);
  const std::string bad = saved.path + ".bad";
  for (size_t at = 0; at < good.size(); ++at) {
    std::string corrupt = good;
    corrupt[at] = static_cast<char>(corrupt[at] ^ 0x20);
    WriteFile(bad, corrupt);
    std::unique_ptr<ShardStore> store = Store();
    const absl::Status s =
        testing::RestoreStoreCheckpoint(bad, store.get()).status();
    INFO("byte " << at << " of " << good.size() << ": " << s.ToString());
    REQUIRE(absl::IsDataLoss(s));
    REQUIRE(absl::StrContains(s.message(), bad));
  }
}

TEST_CASE("every truncation is DATA_LOSS", "[checkpoint]") {
  Saved saved = TrainAndSave();
  const std::string good = ReadFile(saved.path);
  const std::string cut = saved.path + ".cut";
  for (size_t len = 0; len < good.size(); ++len) {
    WriteFile(cut, good.substr(0, len));
    std::unique_ptr<ShardStore> store = Store();
    const absl::Status s =
        testing::RestoreStoreCheckpoint(cut, store.get()).status();
    INFO("length " << len << " of " << good.size() << ": " << s.ToString());
    REQUIRE(absl::IsDataLoss(s));
    REQUIRE(absl::StrContains(s.message(), cut));
  }
  // Extra bytes at the end are corruption too.
  WriteFile(cut, good + "x");
  std::unique_ptr<ShardStore> store = Store();
  CHECK(absl::IsDataLoss(
      testing::RestoreStoreCheckpoint(cut, store.get()).status()));
}

TEST_CASE("another shard's checkpoint is FAILED_PRECONDITION", "[checkpoint]") {
  Saved saved = TrainAndSave();
  for (const auto& [shard, shards] :
       std::vector<std::pair<int, int>>{{0, 2}, {1, 3}, {0, 1}}) {
    std::unique_ptr<ShardStore> store = Store(shard, shards);
    const absl::Status s =
        testing::RestoreStoreCheckpoint(saved.path, store.get()).status();
    INFO(s.ToString());
    CHECK(absl::IsFailedPrecondition(s));
    CHECK(absl::StrContains(s.message(), saved.path));
    CHECK(absl::StrContains(s.message(), "shard 1 of 2"));
    CHECK(store->Size().tensors == 0);
  }
}

TEST_CASE("restore needs an empty store and an existing file", "[checkpoint]") {
  Saved saved = TrainAndSave();
  CHECK(absl::IsFailedPrecondition(
      testing::RestoreStoreCheckpoint(saved.path, saved.store.get()).status()));
  std::unique_ptr<ShardStore> store = Store();
  const absl::Status s =
      testing::RestoreStoreCheckpoint(saved.dir + "/missing.ckpt", store.get())
          .status();
  CHECK(absl::IsNotFound(s));
  CHECK(absl::StrContains(s.message(), "missing.ckpt"));
}

TEST_CASE("a leftover .tmp from an interrupted write changes nothing",
          "[checkpoint]") {
  Saved saved = TrainAndSave();
  const Snapshot at_checkpoint = Take(saved.store.get());
  // A newer write that died halfway: its .tmp holds part of a checkpoint.
  PushRound(saved.store.get(), 3);
  const std::string newer_dir = testing::MakeTmpDir("newer");
  absl::StatusOr<CheckpointInfo> newer =
      testing::WriteStoreCheckpoint(*saved.store, newer_dir);
  REQUIRE_OK(newer.status());
  const std::string partial = ReadFile(newer->path());
  const std::string tmp = saved.path + ".tmp";
  WriteFile(tmp, partial.substr(0, partial.size() / 2));

  std::unique_ptr<ShardStore> restored = Store();
  REQUIRE_OK(
      testing::RestoreStoreCheckpoint(saved.path, restored.get()).status());
  CHECK(Take(restored.get()) == at_checkpoint);

  // The next write replaces the .tmp and leaves none behind.
  REQUIRE_OK(testing::WriteStoreCheckpoint(*saved.store, saved.dir).status());
  struct stat st;
  CHECK(::stat(tmp.c_str(), &st) != 0);
  std::unique_ptr<ShardStore> again = Store();
  REQUIRE_OK(testing::RestoreStoreCheckpoint(saved.path, again.get()).status());
  CHECK(Take(again.get()) == Take(saved.store.get()));
}

TEST_CASE("a write that fails leaves the previous checkpoint", "[checkpoint]") {
  std::unique_ptr<ShardStore> store = Store();
  CreateAll(store.get());
  const absl::Status s =
      testing::WriteStoreCheckpoint(*store, "/nonexistent-asyncps-dir/x")
          .status();
  CHECK(!s.ok());
  CHECK(absl::StrContains(s.message(), "/nonexistent-asyncps-dir/x"));
}

TEST_CASE("a checkpoint taken during pushes holds consistent slices",
          "[checkpoint]") {
  // SGD with lr 1 from zeros and gradients of all ones: a slice at version v
  // holds -v in every element, so any mix of old and new values in one
  // slice would show.
  std::unique_ptr<ShardStore> store = Store(0, 1);
  TensorSpec spec;
  spec.set_name("w");
  spec.add_shape(1 << 16);
  spec.set_slice_elems(1024);
  spec.mutable_optimizer()->set_type(OPT_SGD);
  spec.mutable_optimizer()->set_learning_rate(1.0f);
  CreateTensorRequest create;
  *create.add_tensors() = spec;
  REQUIRE(store->CreateTensors(create).ok());

  std::atomic<bool> stop{false};
  std::thread pusher([&] {
    std::vector<float> ones(1024, 1.0f);
    uint32_t slice = 0;
    while (!stop.load()) {
      PushRequest req;
      for (int k = 0; k < 8; ++k, slice = (slice + 7) % 64) {
        SliceGradient* g = req.add_grads();
        g->set_tensor("w");
        g->set_slice(slice);
        EncodeFloats(ones.data(), ones.size(), g->mutable_grad());
      }
      PushResponse resp;
      // A push that repeats a slice is refused; the others apply.
      testing::ApplyPush(store.get(), req, StalenessRule{}, &resp)
          .IgnoreError();
    }
  });
  const std::string dir = testing::MakeTmpDir("fuzzy");
  std::vector<std::string> paths;
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<CheckpointInfo> info =
        testing::WriteStoreCheckpoint(*store, dir);
    REQUIRE_OK(info.status());
    const std::string copy = absl::StrCat(dir, "/copy-", i);
    WriteFile(copy, ReadFile(info->path()));
    paths.push_back(copy);
  }
  stop.store(true);
  pusher.join();

  uint64_t max_version = 0;
  for (const std::string& path : paths) {
    std::unique_ptr<ShardStore> restored = Store(0, 1);
    REQUIRE_OK(testing::RestoreStoreCheckpoint(path, restored.get()).status());
    for (const auto& [key, slice] : Take(restored.get())) {
      const size_t n = slice.second.size() / sizeof(float);
      std::vector<float> v(n);
      DecodeFloats(slice.second, v.data(), n);
      max_version = std::max(max_version, slice.first);
      for (float x : v) {
        INFO("slice " << key.second << " version " << slice.first);
        REQUIRE(x == -static_cast<float>(slice.first));
      }
    }
  }
  CHECK(max_version > 0);
}

}  // namespace
}  // namespace asyncps
