// checkpoint_bench: time to write and to restore a shard checkpoint
// (server/checkpoint.h) against baselines measured in the same run on the
// same number of bytes in the same directory:
//   raw_write   - one buffer written in 1 MiB writes, fsync, rename,
//                 directory fsync (what an ideal writer must do);
//   raw_read    - the file read back in 1 MiB reads (page cache, like the
//                 restore right after the write).
//
// Stores (one shard of one, all slices local), --slice_elems per slice:
//   mlp    - the 784-256-128-10 MLP of deploy/local.sh (235,146 floats),
//            momentum and Adam;
//   big    - one tensor of --big_elems floats (64M = 256 MiB), SGD and
//            momentum (--big_adam adds Adam: 3x the bytes).
// Each figure is the median of --reps runs. Output, one line per case:
//   case=mlp opt=momentum bytes=... write_ms=... raw_write_ms=...
//     write_ratio=... restore_ms=... raw_read_ms=... restore_ratio=...
// The file lands in --dir (default $TEST_TMPDIR or /tmp); restore reads it
// from the page cache, so restore_ms is CPU (CRC, parse, copies), not disk.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/checkpoint.h"
#include "store/shard_store.h"
#include "tests/bench/bench_util.h"
#include "tests/testing/store_helpers.h"

ABSL_FLAG(std::string, dir, "",
          "Directory for the files ($TEST_TMPDIR or "
          "/tmp when empty).");
ABSL_FLAG(int64_t, slice_elems, 4096, "Slice size (ps_server's default).");
ABSL_FLAG(int64_t, big_elems, int64_t{64} << 20, "Floats of the big tensor.");
ABSL_FLAG(bool, big_adam, false, "Also the big tensor with Adam.");
ABSL_FLAG(int, reps, 3, "Runs per figure (median).");

namespace asyncps {
namespace {

TensorSpec Spec(const std::string& name, std::vector<int64_t> shape,
                OptimizerType type) {
  TensorSpec s;
  s.set_name(name);
  for (int64_t d : shape) s.add_shape(d);
  s.set_init(INIT_UNIFORM);
  s.set_init_value(0.05f);
  s.set_slice_elems(absl::GetFlag(FLAGS_slice_elems));
  OptimizerSpec* o = s.mutable_optimizer();
  o->set_type(type);
  o->set_learning_rate(0.01f);
  o->set_momentum(0.9f);
  o->set_beta1(0.9f);
  o->set_beta2(0.999f);
  o->set_epsilon(1e-8f);
  return s;
}

std::unique_ptr<ShardStore> EmptyStore() {
  ShardStoreOptions o;
  return ShardStore::Create(o).value();
}

// Milliseconds to write `bytes` as an ideal atomic writer would.
double RawWriteMs(const std::string& dir, uint64_t bytes) {
  const std::string tmp = dir + "/raw.tmp";
  const std::string path = dir + "/raw";
  std::string chunk(1 << 20, 'x');
  const absl::Time start = absl::Now();
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  for (uint64_t left = bytes; left > 0;) {
    const size_t n = std::min<uint64_t>(left, chunk.size());
    if (::write(fd, chunk.data(), n) != static_cast<ssize_t>(n)) std::abort();
    left -= n;
  }
  ::fsync(fd);
  ::close(fd);
  ::rename(tmp.c_str(), path.c_str());
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  ::fsync(dfd);
  ::close(dfd);
  return absl::ToDoubleMilliseconds(absl::Now() - start);
}

double RawReadMs(const std::string& path) {
  std::string chunk(1 << 20, '\0');
  const absl::Time start = absl::Now();
  const int fd = ::open(path.c_str(), O_RDONLY);
  while (::read(fd, &chunk[0], chunk.size()) > 0) {
  }
  ::close(fd);
  return absl::ToDoubleMilliseconds(absl::Now() - start);
}

void Run(const std::string& name, const std::string& opt,
         const std::vector<TensorSpec>& specs, const std::string& dir) {
  std::unique_ptr<ShardStore> store = EmptyStore();
  CreateTensorRequest req;
  for (const TensorSpec& s : specs) *req.add_tensors() = s;
  if (!store->CreateTensors(req).ok()) std::abort();
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  std::vector<double> write, raw_write, restore, raw_read;
  uint64_t bytes = 0;
  int32_t slices = 0;
  for (int r = 0; r < reps; ++r) {
    absl::StatusOr<CheckpointInfo> info =
        testing::WriteStoreCheckpoint(*store, dir);
    if (!info.ok()) {
      std::fprintf(stderr, "%s\n", info.status().ToString().c_str());
      std::exit(1);
    }
    write.push_back(info->duration_ms());
    bytes = info->bytes();
    slices = info->slices();
    raw_write.push_back(RawWriteMs(dir, bytes));
    raw_read.push_back(RawReadMs(info->path()));
    std::unique_ptr<ShardStore> restored = EmptyStore();
    absl::StatusOr<CheckpointInfo> back =
        testing::RestoreStoreCheckpoint(info->path(), restored.get());
    if (!back.ok()) {
      std::fprintf(stderr, "%s\n", back.status().ToString().c_str());
      std::exit(1);
    }
    restore.push_back(back->duration_ms());
  }
  const double w = Median(write), rw = Median(raw_write);
  const double rs = Median(restore), rr = Median(raw_read);
  std::printf(
      "case=%s opt=%s slices=%d bytes=%llu write_ms=%.1f raw_write_ms=%.1f "
      "write_ratio=%.2f write_mb_per_s=%.0f restore_ms=%.1f raw_read_ms=%.1f "
      "restore_ratio=%.2f restore_mb_per_s=%.0f\n",
      name.c_str(), opt.c_str(), slices, static_cast<unsigned long long>(bytes),
      w, rw, w / rw, bytes / 1e3 / w, rs, rr, rs / rr, bytes / 1e3 / rs);
  std::fflush(stdout);
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string dir = BenchDir(absl::GetFlag(FLAGS_dir));
  for (const auto& [opt, type] :
       std::vector<std::pair<std::string, OptimizerType>>{
           {"momentum", OPT_MOMENTUM}, {"adam", OPT_ADAM}}) {
    Run("mlp", opt,
        {Spec("w1", {784, 256}, type), Spec("b1", {256}, type),
         Spec("w2", {256, 128}, type), Spec("b2", {128}, type),
         Spec("w3", {128, 10}, type), Spec("b3", {10}, type)},
        dir);
  }
  std::vector<std::pair<std::string, OptimizerType>> big = {
      {"sgd", OPT_SGD}, {"momentum", OPT_MOMENTUM}};
  if (absl::GetFlag(FLAGS_big_adam)) big.push_back({"adam", OPT_ADAM});
  for (const auto& [opt, type] : big) {
    Run("big", opt, {Spec("big", {absl::GetFlag(FLAGS_big_elems)}, type)}, dir);
  }
  return 0;
}

}  // namespace
}  // namespace asyncps

int main(int argc, char** argv) { return asyncps::Main(argc, argv); }
