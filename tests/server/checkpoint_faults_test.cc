// Checkpoint writes through a file system that fails or crashes at every
// step in turn (tests/testing/fault_file_system.h): short writes, failed
// fsync of the file or the directory, failed close or rename, and a crash
// between any two steps. The previous checkpoint always survives a write
// that failed before its rename; a restore always reads one whole
// checkpoint (the previous or the new one), never a torn file; a later
// write succeeds.

#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "common/payload.h"
#include "server/checkpoint.h"
#include "store/shard_store.h"
#include "tests/testing/fault_file_system.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/store_helpers.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

using Fault = testing::FaultFileSystem::Fault;

std::unique_ptr<ShardStore> Store() {
  ShardStoreOptions o;
  o.default_slice_elems = 16;
  return ShardStore::Create(o).value();
}

// (slice) -> (version, values) of tensor "w".
using Values = std::map<uint32_t, std::pair<uint64_t, std::string>>;

Values Take(const ShardStore& store) {
  PullRequest req;
  req.add_tensors("w");
  PullResponse resp;
  REQUIRE_OK(store.Pull(req, &resp));
  Values out;
  for (const SliceData& d : resp.slices()) {
    out[d.slice()] = {d.version(), d.values()};
  }
  return out;
}

void Push(ShardStore* store, float g) {
  PushRequest req;
  for (const auto& [slice, v] : Take(*store)) {
    SliceGradient* grad = req.add_grads();
    grad->set_tensor("w");
    grad->set_slice(slice);
    grad->set_read_version(v.first);
    std::vector<float> values(v.second.size() / sizeof(float), g);
    EncodeFloats(values.data(), values.size(), grad->mutable_grad());
  }
  PushResponse resp;
  REQUIRE_OK(testing::ApplyPush(store, req, StalenessRule{}, &resp));
}

// What a restart would restore from `path`.
absl::StatusOr<Values> Restore(const std::string& path) {
  std::unique_ptr<ShardStore> store = Store();
  absl::StatusOr<RestoredCheckpoint> r = RestoreCheckpoint(path, store.get());
  if (!r.ok()) return r.status();
  return Take(*store);
}

TEST_CASE(
    "a checkpoint write that fails or crashes at any step leaves a "
    "whole checkpoint",
    "[checkpoint][faults]") {
  std::unique_ptr<ShardStore> store = Store();
  TensorSpec spec;
  spec.set_name("w");
  spec.add_shape(40);
  spec.add_shape(50);  // 125 slices: a file of several appends
  spec.set_init(INIT_UNIFORM);
  spec.set_init_value(1.0f);
  spec.set_seed(3);
  spec.mutable_optimizer()->set_type(OPT_SGD);
  spec.mutable_optimizer()->set_learning_rate(0.5f);
  CreateTensorRequest create;
  *create.add_tensors() = spec;
  REQUIRE_OK(store->CreateTensors(create).status());
  const CheckpointImage old_image = CaptureCheckpoint(*store, {}, absl::Now());
  const Values old_values = Take(*store);
  Push(store.get(), 0.25f);
  const CheckpointImage new_image = CaptureCheckpoint(*store, {}, absl::Now());
  const Values new_values = Take(*store);
  REQUIRE(old_values != new_values);

  // The operations of one clean write.
  const std::string probe_dir = testing::MakeTmpDir("ckpt_probe");
  testing::FaultFileSystem counter;
  REQUIRE_OK(
      WriteCheckpoint(new_image, probe_dir, Clock::Real(), &counter).status());
  const int steps = counter.ops();
  REQUIRE(steps >= 6);  // create, appends, fsync, close, rename, dir fsync

  int cases = 0, kept_old = 0, took_new = 0;
  for (Fault fault :
       {Fault::kShortWrite, Fault::kFailSync, Fault::kFailOp, Fault::kCrash}) {
    for (int at = 0; at < steps; ++at) {
      const std::string dir = testing::MakeTmpDir("ckpt_fault");
      absl::StatusOr<CheckpointInfo> old_info = WriteCheckpoint(old_image, dir);
      REQUIRE_OK(old_info.status());
      const std::string path = old_info->path();
      testing::FaultFileSystem fs;
      fs.Arm(at, fault);
      absl::StatusOr<CheckpointInfo> written =
          WriteCheckpoint(new_image, dir, Clock::Real(), &fs);
      INFO("fault " << static_cast<int>(fault) << " at step " << at << " of "
                    << steps << ": " << written.status());
      absl::StatusOr<Values> restored = Restore(path);
      REQUIRE_OK(restored.status());  // never torn, never missing
      const bool is_new = *restored == new_values;
      REQUIRE((is_new || *restored == old_values));
      if (written.ok()) {
        REQUIRE(is_new);
      } else {
        REQUIRE(absl::StrContains(written.status().ToString(), dir));
        // Before the rename the old checkpoint stays; after it (the final
        // directory sync) the new one is in place.
        REQUIRE(is_new == (at == steps - 1));
      }
      (is_new ? took_new : kept_old) += 1;
      // The next write (the shard's next checkpoint) succeeds over whatever
      // the fault left, a .tmp included.
      REQUIRE_OK(WriteCheckpoint(new_image, dir).status());
      absl::StatusOr<Values> again = Restore(path);
      REQUIRE_OK(again.status());
      REQUIRE(*again == new_values);
      ++cases;
    }
  }
  REQUIRE(cases == 4 * steps);
  REQUIRE(kept_old > 0);
  REQUIRE(took_new > 0);
}

}  // namespace
}  // namespace asyncps
