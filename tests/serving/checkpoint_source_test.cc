// The checkpoint-directory ParameterSource (serving/parameter_source.h)
// over real checkpoint files: it serves what they hold, restores them again
// when a newer checkpoint replaces them, and refuses a newer one whose
// tensors or tables changed shape, or that cannot be listed, stat'ed or read
// (tests/testing/fault_file_system.h), keeping what it serves.

#include <cerrno>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "common/logging.h"
#include "common/payload.h"
#include "server/checkpoint.h"
#include "server/checkpoint_delta.h"
#include "server/file_system.h"
#include "serving/parameter_source.h"
#include "serving/snapshot.h"
#include "store/shard_store.h"
#include "tests/testing/fault_file_system.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/store_helpers.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

// One shard of one holding "w" (zeros, SGD at rate 1) of `elems` and table
// "t" of `dim`.
std::unique_ptr<ShardStore> Shard(int64_t elems, int dim) {
  ShardStoreOptions o;
  o.shard_index = 0;
  o.num_shards = 1;
  o.default_slice_elems = 8;
  std::unique_ptr<ShardStore> store = ShardStore::Create(o).value();
  CreateTensorRequest req;
  TensorSpec* w = req.add_tensors();
  w->set_name("w");
  w->add_shape(elems);
  w->set_init(INIT_ZEROS);
  w->mutable_optimizer()->set_type(OPT_SGD);
  w->mutable_optimizer()->set_learning_rate(1.0f);
  TableSpec* t = req.add_tables();
  t->set_name("t");
  t->set_dim(dim);
  t->mutable_optimizer()->set_type(OPT_SGD);
  t->mutable_optimizer()->set_learning_rate(1.0f);
  REQUIRE_OK(store->CreateTensors(req).status());
  return store;
}

// Pushes gradient `g` to every element of "w" (one slice).
void Push(ShardStore* store, int64_t elems, float g) {
  PushRequest req;
  SliceGradient* s = req.add_grads();
  s->set_tensor("w");
  s->set_slice(0);
  const std::vector<float> grad(elems, g);
  EncodeFloats(grad.data(), grad.size(), s->mutable_grad());
  PushResponse resp;
  REQUIRE_OK(testing::ApplyPush(store, req, StalenessRule{}, &resp));
}

// "w" as the source serves it now, and its version.
std::vector<float> Served(ParameterSource* source, uint64_t* version) {
  absl::StatusOr<ListTensorsResponse> list = source->List();
  REQUIRE_OK(list.status());
  REQUIRE(list->tensors_size() == 1);
  std::vector<float> w(list->tensors(0).shape(0));
  std::vector<uint64_t> versions;
  REQUIRE_OK(source->Read({{"w", w.data()}}, &versions));
  *version = versions.at(0);
  return w;
}

TEST_CASE("a checkpoint directory is followed as newer checkpoints come",
          "[serving][checkpoint]") {
  const std::string dir = testing::MakeTmpDir("follow");
  std::unique_ptr<ShardStore> store = Shard(4, 2);
  REQUIRE_OK(testing::WriteStoreCheckpoint(*store, dir).status());
  absl::StatusOr<std::unique_ptr<ParameterSource>> source =
      MakeCheckpointSource({dir});
  REQUIRE_OK(source.status());
  uint64_t version = 9;
  CHECK(Served(source->get(), &version) == std::vector<float>(4, 0.0f));
  CHECK(version == 0);

  // A newer checkpoint replaces the file: served at the next List.
  Push(store.get(), 4, 0.5f);
  REQUIRE_OK(testing::WriteStoreCheckpoint(*store, dir).status());
  CHECK(Served(source->get(), &version) == std::vector<float>(4, -0.5f));
  CHECK(version == 1);
  Push(store.get(), 4, 0.25f);
  REQUIRE_OK(testing::WriteStoreCheckpoint(*store, dir).status());
  CHECK(Served(source->get(), &version) == std::vector<float>(4, -0.75f));
  CHECK(version == 2);

  // Another run's files with "w" of 5 elements: refused, naming it; what
  // was loaded is still served.
  std::unique_ptr<ShardStore> other = Shard(5, 2);
  REQUIRE_OK(testing::WriteStoreCheckpoint(*other, dir).status());
  absl::StatusOr<ListTensorsResponse> list = (*source)->List();
  INFO(list.status().ToString());
  CHECK(absl::IsFailedPrecondition(list.status()));
  CHECK(list.status().message().find("'w' is now 5, was 4") !=
        std::string::npos);
  std::vector<float> w(4);
  std::vector<uint64_t> versions;
  REQUIRE_OK((*source)->Read({{"w", w.data()}}, &versions));
  CHECK(w == std::vector<float>(4, -0.75f));

  // Rows of another dim: refused too.
  std::unique_ptr<ShardStore> wider = Shard(4, 3);
  REQUIRE_OK(testing::WriteStoreCheckpoint(*wider, dir).status());
  list = (*source)->List();
  INFO(list.status().ToString());
  CHECK(absl::IsFailedPrecondition(list.status()));
  CHECK(list.status().message().find("'t' is now rows of 3, was rows of 2") !=
        std::string::npos);

  // The same shapes again: followed.
  Push(store.get(), 4, 0.25f);
  REQUIRE_OK(testing::WriteStoreCheckpoint(*store, dir).status());
  CHECK(Served(source->get(), &version) == std::vector<float>(4, -1.0f));
  CHECK(version == 3);
}

// Pushes gradient `g` (dim 2) to row `id` of table "t".
void PushRow(ShardStore* store, uint64_t id, std::vector<float> g) {
  PushRequest req;
  RowsGradient* rows = req.add_rows();
  rows->set_table("t");
  rows->add_ids(id);
  EncodeFloats(g.data(), g.size(), rows->mutable_grad());
  PushResponse resp;
  REQUIRE_OK(testing::ApplyPush(store, req, StalenessRule{}, &resp));
}

// Row `id` of "t" as the source serves it now (after a List, as a
// snapshot refresh does).
std::vector<float> ServedRow(ParameterSource* source, uint64_t id) {
  REQUIRE_OK(source->List().status());
  std::vector<float> row(2);
  REQUIRE_OK(source->ReadRows("t", {id}, row.data()));
  return row;
}

TEST_CASE("the deltas of a checkpoint directory are followed",
          "[serving][checkpoint][delta]") {
  const std::string dir = testing::MakeTmpDir("follow_deltas");
  std::unique_ptr<ShardStore> store = Shard(4, 2);
  // A full checkpoint, as the shard's checkpointer writes it.
  uint32_t since = store->AdvanceChangeEpoch();
  uint32_t crc = 0;
  absl::StatusOr<CheckpointInfo> full =
      WriteCheckpoint(CaptureCheckpoint(*store, {}, absl::Now()), dir,
                      Clock::Real(), nullptr, &crc);
  REQUIRE_OK(full.status());
  absl::StatusOr<std::unique_ptr<ParameterSource>> source =
      MakeCheckpointSource({dir});
  REQUIRE_OK(source.status());
  CHECK(ServedRow(source->get(), 42) == std::vector<float>(2, 0.0f));

  DeltaChain chain;
  chain.base_crc = crc;
  chain.base_bytes = full->bytes();
  chain.base_unix_time_ms = full->unix_time_ms();
  // Each delta (a new row, the dense tensor pushed) is served at the next
  // refresh.
  for (int k = 1; k <= 2; ++k) {
    PushRow(store.get(), 42, {1.0f, 2.0f});
    Push(store.get(), 4, 0.5f);
    const uint32_t next = store->AdvanceChangeEpoch();
    absl::StatusOr<CheckpointInfo> delta =
        WriteCheckpoint(CaptureDelta(*store, {}, absl::Now(), since, chain),
                        dir, Clock::Real(), nullptr, &crc);
    REQUIRE_OK(delta.status());
    REQUIRE(delta->delta());
    REQUIRE(delta->path() == DeltaPath(dir, 0, 1, k));
    since = next;
    chain.sequence = k + 1;
    chain.previous_crc = crc;
    CHECK(ServedRow(source->get(), 42) ==
          std::vector<float>{-1.0f * k, -2.0f * k});
    uint64_t version = 0;
    CHECK(Served(source->get(), &version) == std::vector<float>(4, -0.5f * k));
    CHECK(version == static_cast<uint64_t>(k));
  }
}

TEST_CASE(
    "a reload whose files cannot be listed, stat'ed or read keeps serving "
    "the previous snapshot",
    "[serving][checkpoint][faults]") {
  const std::string dir = testing::MakeTmpDir("follow_faults");
  const std::string ckpt = CheckpointPath(dir, 0, 1);
  std::unique_ptr<ShardStore> store = Shard(4, 2);
  testing::FaultFileSystem fs;

  // A source that cannot read its files at the start is an error naming
  // them, not an empty model.
  REQUIRE_OK(testing::WriteStoreCheckpoint(*store, dir).status());
  fs.FailReads(ckpt);
  absl::StatusOr<std::unique_ptr<ParameterSource>> source =
      MakeCheckpointSource({dir, &fs});
  INFO(source.status().ToString());
  CHECK(source.status().code() == absl::ErrnoToStatus(EIO, "").code());
  CHECK(absl::StrContains(source.status().message(), ckpt));
  fs.ClearPathFaults();
  source = MakeCheckpointSource({dir, &fs});
  REQUIRE_OK(source.status());
  SnapshotKeeper keeper(source->get(), {"w"}, absl::ZeroDuration(),
                        NullLogger());
  REQUIRE_OK(keeper.Refresh());
  const std::shared_ptr<const Snapshot> first = keeper.Current();
  REQUIRE(first != nullptr);
  CHECK(first->values[0] == std::vector<float>(4, 0.0f));

  // A newer checkpoint that cannot be read: every refresh fails, naming
  // the file or directory, and the first snapshot is still served.
  Push(store.get(), 4, 0.5f);
  REQUIRE_OK(testing::WriteStoreCheckpoint(*store, dir).status());
  struct Case {
    std::string what;
    std::function<void()> arm;
    absl::StatusCode code;
    std::string named;
  };
  const absl::StatusOr<FileStat> size = FileSystem::Default()->Stat(ckpt);
  REQUIRE_OK(size.status());
  const std::vector<Case> cases = {
      {"unlistable directory", [&] { fs.FailListing(dir, EACCES); },
       absl::StatusCode::kPermissionDenied, dir},
      {"vanished after the listing", [&] { fs.VanishAfterListing(ckpt); },
       absl::StatusCode::kNotFound, ckpt},
      {"reads back truncated", [&] { fs.TruncateReads(ckpt, size->size / 2); },
       absl::StatusCode::kDataLoss, ckpt},
      {"reads fail", [&] { fs.FailReads(ckpt); },
       absl::ErrnoToStatus(EIO, "").code(), ckpt},
  };
  for (const Case& c : cases) {
    fs.ClearPathFaults();
    c.arm();
    const absl::Status refreshed = keeper.Refresh();
    INFO(c.what << ": " << refreshed.ToString());
    CHECK(refreshed.code() == c.code);
    CHECK(absl::StrContains(refreshed.message(), c.named));
    CHECK(keeper.Current() == first);  // the same snapshot, still served
    std::vector<float> w(4);
    std::vector<uint64_t> versions;
    REQUIRE_OK((*source)->Read({{"w", w.data()}}, &versions));
    CHECK(w == std::vector<float>(4, 0.0f));
    CHECK(versions == std::vector<uint64_t>{0});
  }
  CHECK(keeper.refresh_failures() == cases.size());

  // The fault gone, the newer checkpoint is served.
  fs.ClearPathFaults();
  REQUIRE_OK(keeper.Refresh());
  CHECK(keeper.Current()->values[0] == std::vector<float>(4, -0.5f));
  CHECK(keeper.Current()->versions == std::vector<uint64_t>{1});
}

}  // namespace
}  // namespace asyncps
