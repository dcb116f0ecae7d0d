// apply_bench: throughput of the server's push hot path, ShardStore::
// PreparePush (lookups, length checks, the NaN/Inf scan) followed by
// ShardStore::ApplyPush (slice locks, optimizer, versions, results), against
// baselines measured in the same run on the same number of floats:
//   memcpy  - dst = src, the machine's copy bandwidth;
//   raw     - the optimizer's arithmetic as a bare loop over flat arrays
//             (w -= lr*g; momentum; Adam), no store, no validation.
//
// The tensor holds --elems floats (64M = 256 MiB) in slices of
// --slice_elems; it is updated by pushes of about --push_bytes each (as a
// worker sends them), prepared once, so every pass reads gradients and
// parameters from memory. With --threads=2 each thread applies half of the
// pushes (concurrent pushes from different workers on different slices).
//
// Bandwidth counts the bytes an update must move (read + write):
//   memcpy 8 B/elem, SGD 12, momentum 20, Adam 28,
// so "GB/s" is comparable across rows; updates/s is floats updated per
// second. Every figure is the median of --reps timed runs of at least
// --min_seconds. Output, one line per measurement:
//   threads=1 kind=memcpy ... gb_per_s=... updates_per_s=...
//   threads=1 opt=sgd slice_elems=4096 kind=store ... ratio_to_raw=0.83
//     ratio_to_memcpy=...

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/net.h"
#include "common/payload.h"
#include "proto/asyncps.pb.h"
#include "store/shard_store.h"

ABSL_FLAG(int64_t, elems, int64_t{64} << 20, "floats in the tensor");
ABSL_FLAG(std::string, slice_elems, "4096,65536",
          "comma-separated slice sizes (floats) to measure");
ABSL_FLAG(int64_t, push_bytes, 1 << 20,
          "gradient bytes per push request (rounded to whole slices, at "
          "least one)");
ABSL_FLAG(std::string, optimizers, "sgd,momentum,adam",
          "comma-separated: sgd, momentum, adam");
ABSL_FLAG(std::string, threads, "1,2", "comma-separated thread counts");
ABSL_FLAG(int, reps, 3, "timed runs per measurement (median reported)");
ABSL_FLAG(double, min_seconds, 0.4, "minimum length of one timed run");
ABSL_FLAG(bool, tune_malloc, true,
          "call TuneMallocForLargeMessages() at start, as ps_server does");

namespace asyncps {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// CPU seconds used by this process so far (all threads). On a shared,
// loaded machine CPU time per pass is steadier than wall time.
double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Wall and CPU seconds of one timed run.
struct Timing {
  double wall = 0;
  double cpu = 0;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<std::string> SplitList(const std::string& s) {
  return absl::StrSplit(s, ',', absl::SkipWhitespace());
}

int BytesPerUpdate(const std::string& opt) {
  if (opt == "sgd") return 12;
  if (opt == "momentum") return 20;
  return 28;  // adam
}

OptimizerSpec MakeOptimizer(const std::string& name) {
  OptimizerSpec o;
  o.set_learning_rate(1e-6f);
  if (name == "momentum") {
    o.set_type(OPT_MOMENTUM);
    o.set_momentum(0.9f);
  } else if (name == "adam") {
    o.set_type(OPT_ADAM);
    o.set_beta1(0.9f);
    o.set_beta2(0.999f);
    o.set_epsilon(1e-8f);
  } else {
    o.set_type(OPT_SGD);
  }
  return o;
}

// Runs `pass(thread, threads)` on `threads` threads, `passes` times each,
// and returns the wall and CPU time.
Timing RunPasses(int threads, int passes,
                 const std::function<void(int, int)>& pass) {
  const double cpu0 = ProcessCpuSeconds();
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int p = 0; p < passes; ++p) pass(t, threads);
    });
  }
  for (int p = 0; p < passes; ++p) pass(0, threads);
  for (std::thread& th : pool) th.join();
  return {Seconds(start, Clock::now()), ProcessCpuSeconds() - cpu0};
}

// Seconds per pass: median over reps of (time of k passes) / k, wall and
// CPU separately, with k chosen from a calibration pass so that a run lasts
// >= min_seconds.
Timing SecondsPerPass(int threads, const std::function<void(int, int)>& pass) {
  const double once = RunPasses(threads, 1, pass).wall;  // also warms up
  const int passes = std::max(
      1, static_cast<int>(std::ceil(absl::GetFlag(FLAGS_min_seconds) / once)));
  std::vector<double> wall, cpu;
  for (int r = 0; r < absl::GetFlag(FLAGS_reps); ++r) {
    const Timing t = RunPasses(threads, passes, pass);
    wall.push_back(t.wall / passes);
    cpu.push_back(t.cpu / passes);
  }
  return {Median(wall), Median(cpu)};
}

// [begin, end) of part `t` of `threads` equal parts of n.
std::pair<int64_t, int64_t> Part(int64_t n, int t, int threads) {
  return {n * t / threads, n * (t + 1) / threads};
}

// The bare loops: the same arithmetic as store/optimizer.cc over flat
// arrays (compiled with the same -O3).
struct RawArrays {
  explicit RawArrays(int64_t n)
      : w(n, 0.5f), g(n, 1e-3f), m(n, 0.0f), v(n, 0.0f), dst(n, 0.0f) {}
  std::vector<float> w, g, m, v, dst;
};

// Compiled for SSE2 and AVX2 as the store's loops are (store/optimizer.cc).
__attribute__((target_clones("avx2", "default"))) void RawSgd(float* w,
                                                              const float* g,
                                                              int64_t n,
                                                              float lr) {
  for (int64_t i = 0; i < n; ++i) w[i] -= lr * g[i];
}

__attribute__((target_clones("avx2", "default"))) void RawMomentum(
    float* w, const float* g, float* v, int64_t n, float lr, float mu) {
  for (int64_t i = 0; i < n; ++i) {
    v[i] = mu * v[i] + g[i];
    w[i] -= lr * v[i];
  }
}

__attribute__((target_clones("avx2", "default"))) void RawAdam(
    float* w, const float* g, float* m, float* v, int64_t n, float lr, float b1,
    float b2, float eps, float c1, float c2) {
  for (int64_t i = 0; i < n; ++i) {
    m[i] = b1 * m[i] + (1 - b1) * g[i];
    v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
    w[i] -= lr * (m[i] * c1) / (std::sqrt(v[i] * c2) + eps);
  }
}

std::function<void(int, int)> RawPass(const std::string& opt, RawArrays* a) {
  const int64_t n = static_cast<int64_t>(a->w.size());
  return [opt, a, n](int t, int threads) {
    const auto [b, e] = Part(n, t, threads);
    if (opt == "sgd") {
      RawSgd(a->w.data() + b, a->g.data() + b, e - b, 1e-6f);
    } else if (opt == "momentum") {
      RawMomentum(a->w.data() + b, a->g.data() + b, a->v.data() + b, e - b,
                  1e-6f, 0.9f);
    } else {
      RawAdam(a->w.data() + b, a->g.data() + b, a->m.data() + b,
              a->v.data() + b, e - b, 1e-6f, 0.9f, 0.999f, 1e-8f, 10.0f,
              1000.0f);
    }
  };
}

void Print(int threads, const std::string& what, const Timing& t, int64_t elems,
           int bytes_per_elem, const std::string& extra) {
  const double gbps =
      static_cast<double>(elems) * bytes_per_elem / t.wall / 1e9;
  const double ups = static_cast<double>(elems) / t.wall;
  std::printf(
      "threads=%d %s ms_per_pass=%.2f cpu_ms_per_pass=%.2f gb_per_s=%.2f "
      "updates_per_s=%.3g%s\n",
      threads, what.c_str(), t.wall * 1e3, t.cpu * 1e3, gbps, ups,
      extra.c_str());
  std::fflush(stdout);
}

// A store holding one tensor of `elems` floats and the pushes that cover it.
struct StoreSetup {
  std::unique_ptr<ShardStore> store;
  std::vector<PushRequest> pushes;
};

absl::StatusOr<StoreSetup> MakeStore(int64_t elems, int64_t slice_elems,
                                     const std::string& opt,
                                     int64_t push_bytes) {
  ShardStoreOptions options;
  options.default_slice_elems = slice_elems;
  absl::StatusOr<std::unique_ptr<ShardStore>> store =
      ShardStore::Create(options);
  if (!store.ok()) return store.status();
  CreateTensorRequest create;
  TensorSpec* spec = create.add_tensors();
  spec->set_name("apply_bench/weights");
  spec->add_shape(elems);
  spec->set_init(INIT_CONSTANT);
  spec->set_init_value(0.5f);
  spec->set_slice_elems(slice_elems);
  *spec->mutable_optimizer() = MakeOptimizer(opt);
  absl::StatusOr<CreateTensorResponse> created =
      (*store)->CreateTensors(create);
  if (!created.ok()) return created.status();

  StoreSetup setup;
  setup.store = *std::move(store);
  const int64_t num_slices = (elems + slice_elems - 1) / slice_elems;
  const int64_t per_push = std::max<int64_t>(
      1, push_bytes / (slice_elems * static_cast<int64_t>(sizeof(float))));
  std::vector<float> grad(slice_elems, 1e-3f);
  uint64_t seq = 1;
  for (int64_t first = 0; first < num_slices; first += per_push) {
    PushRequest& req = setup.pushes.emplace_back();
    req.mutable_worker()->set_worker_id(0);
    req.mutable_worker()->set_incarnation(1);
    req.set_seq(seq++);
    for (int64_t i = first; i < std::min(num_slices, first + per_push); ++i) {
      SliceGradient* g = req.add_grads();
      g->set_tensor(spec->name());
      g->set_slice(static_cast<uint32_t>(i));
      const int64_t size = std::min(slice_elems, elems - i * slice_elems);
      EncodeFloats(grad.data(), static_cast<size_t>(size), g->mutable_grad());
    }
  }
  return setup;
}

int Main() {
  if (absl::GetFlag(FLAGS_tune_malloc)) TuneMallocForLargeMessages();
  const int64_t elems = absl::GetFlag(FLAGS_elems);
  if (elems <= 0) {
    std::fprintf(stderr, "apply_bench: --elems must be > 0\n");
    return 2;
  }
  std::vector<int> thread_counts;
  for (const std::string& s : SplitList(absl::GetFlag(FLAGS_threads))) {
    int t = 0;
    if (!absl::SimpleAtoi(s, &t) || t < 1 || t > 64) {
      std::fprintf(stderr, "apply_bench: bad --threads entry '%s'\n",
                   s.c_str());
      return 2;
    }
    thread_counts.push_back(t);
  }
  std::vector<int64_t> slice_sizes;
  for (const std::string& s : SplitList(absl::GetFlag(FLAGS_slice_elems))) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(s, &v) || v < 1) {
      std::fprintf(stderr, "apply_bench: bad --slice_elems entry '%s'\n",
                   s.c_str());
      return 2;
    }
    slice_sizes.push_back(v);
  }
  const std::vector<std::string> opts =
      SplitList(absl::GetFlag(FLAGS_optimizers));
  for (const std::string& o : opts) {
    if (o != "sgd" && o != "momentum" && o != "adam") {
      std::fprintf(stderr, "apply_bench: unknown optimizer '%s'\n", o.c_str());
      return 2;
    }
  }
  std::printf(
      "apply_bench elems=%lld (%.0f MiB of parameters) push_bytes=%lld "
      "reps=%d tune_malloc=%d\n",
      static_cast<long long>(elems), elems * 4.0 / (1 << 20),
      static_cast<long long>(absl::GetFlag(FLAGS_push_bytes)),
      absl::GetFlag(FLAGS_reps), absl::GetFlag(FLAGS_tune_malloc));

  RawArrays raw(elems);
  // memcpy baseline, per thread count.
  std::vector<double> memcpy_gbps(65, 0);
  for (int threads : thread_counts) {
    const Timing s = SecondsPerPass(threads, [&](int t, int n) {
      const auto [b, e] = Part(elems, t, n);
      std::memcpy(raw.dst.data() + b, raw.g.data() + b,
                  (e - b) * sizeof(float));
    });
    memcpy_gbps[threads] = elems * 8.0 / s.wall / 1e9;
    Print(threads, "kind=memcpy", s, elems, 8, "");
  }

  for (const std::string& opt : opts) {
    const int bpu = BytesPerUpdate(opt);
    for (int64_t slice_elems : slice_sizes) {
      absl::StatusOr<StoreSetup> setup =
          MakeStore(elems, slice_elems, opt, absl::GetFlag(FLAGS_push_bytes));
      if (!setup.ok()) {
        std::fprintf(stderr, "apply_bench: %s\n",
                     setup.status().ToString().c_str());
        return 1;
      }
      ShardStore* store = setup->store.get();
      const std::vector<PushRequest>& pushes = setup->pushes;
      const StalenessRule rule;  // unbounded, no scaling
      std::atomic<bool> failed{false};
      // Validation time is accumulated separately (thread 0 only) to show
      // how much of the path the checks and the NaN/Inf scan take.
      double validate_s = 0;
      auto store_pass = [&](int t, int n) {
        const auto [b, e] = Part(static_cast<int64_t>(pushes.size()), t, n);
        for (int64_t k = b; k < e; ++k) {
          const Clock::time_point v0 = Clock::now();
          const std::vector<Payload> grads = ShardStore::PayloadsOf(pushes[k]);
          absl::StatusOr<ShardStore::PreparedPush> prepared =
              store->PreparePush(pushes[k], grads, /*rows=*/{},
                                 PushMode::kApply);
          if (t == 0) validate_s += Seconds(v0, Clock::now());
          if (!prepared.ok()) {
            failed = true;
            return;
          }
          PushResponse response;
          store->CommitPush(&*prepared, rule, &response);
        }
      };
      for (int threads : thread_counts) {
        const Timing raw_t = SecondsPerPass(threads, RawPass(opt, &raw));
        validate_s = 0;
        const double once = RunPasses(threads, 1, store_pass).wall;
        const int passes = std::max(
            1, static_cast<int>(
                   std::ceil(absl::GetFlag(FLAGS_min_seconds) / once)));
        std::vector<double> wall, cpu, validate_share;
        for (int r = 0; r < absl::GetFlag(FLAGS_reps); ++r) {
          validate_s = 0;
          const Timing t = RunPasses(threads, passes, store_pass);
          wall.push_back(t.wall / passes);
          cpu.push_back(t.cpu / passes);
          validate_share.push_back(validate_s / t.wall);
        }
        if (failed) {
          std::fprintf(stderr, "apply_bench: PreparePush refused a push\n");
          return 1;
        }
        const Timing store_t = {Median(wall), Median(cpu)};
        const std::string what =
            absl::StrCat("opt=", opt, " slice_elems=", slice_elems);
        Print(threads, absl::StrCat(what, " kind=raw"), raw_t, elems, bpu, "");
        const double store_gbps =
            elems * static_cast<double>(bpu) / store_t.wall / 1e9;
        Print(threads, absl::StrCat(what, " kind=store"), store_t, elems, bpu,
              absl::StrFormat(" validate_share=%.2f ratio_to_raw=%.2f "
                              "cpu_ratio_to_raw=%.2f ratio_to_memcpy=%.2f",
                              Median(validate_share), raw_t.wall / store_t.wall,
                              raw_t.cpu / store_t.cpu,
                              store_gbps / memcpy_gbps[threads]));
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace asyncps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return asyncps::Main();
}
