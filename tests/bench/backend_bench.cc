// backend_bench: throughput of the CPU and CUDA backends.
//
// Two measurements per backend, each against the other backend in the same
// run:
//  * mlp: examples/s of one training step through the worker's own path
//    (Mlp::ComputeGradients: parameter upload, forward, backward, gradient
//    download) on random data, for every --models x --batches; also the
//    step's GEMM work as FLOP/s (2 m n k per GEMM over the step's wall time).
//  * gemm: FLOP/s of Backend::Gemm on square fp32 matrices (--gemm_sizes),
//    and the fraction of --peak_tflops when that is given.
//
// Output, one line per result (key=value, for scripts):
//   mlp model=784-256-128-10 batch=64 backend=cpu steps=50 seconds=1.234
//     examples_per_s=5187.2 gemm_tflops=0.123 mean_loss=2.41
//   mlp model=784-256-128-10 batch=64 ratio_cuda_over_cpu=12.30
//   gemm n=4096 backend=cuda calls=40 seconds=0.110 tflops=50.1
//     peak_fraction=0.748
//   gemm n=4096 ratio_cuda_over_cpu=48.2
// and, with --csv, the same numbers as CSV.
//
// --device: auto (CPU, and CUDA when usable; default), cpu, cuda (CUDA
// only) or both (CPU and CUDA). With cuda or both an unusable GPU exits 1;
// with auto it prints "cuda: unavailable (<reason>)" and measures the CPU.
// Exits 1 if a backend fails a step, 2 for bad flags.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kernels/backend.h"
#include "models/mlp.h"

ABSL_FLAG(std::string, device, "auto",
          "auto (CPU + CUDA when usable), cpu, cuda, or both (CPU + CUDA, "
          "CUDA required).");
ABSL_FLAG(std::string, models, "784-256-128-10,784-4096-4096-10",
          "Comma-separated MLP layer sizes, each as in-hidden...-classes.");
ABSL_FLAG(std::string, batches, "64,1024", "Comma-separated batch sizes.");
ABSL_FLAG(std::string, gemm_sizes, "1024,2048,4096,8192",
          "Comma-separated n of the n x n x n GEMM benchmark; empty = none.");
ABSL_FLAG(double, peak_tflops, 0,
          "The CUDA device's fp32 (non-tensor-core) peak in TFLOP/s; when "
          "> 0 CUDA GEMM results also print their fraction of it.");
ABSL_FLAG(int, iters, 50,
          "timed steps per MLP measurement, at most; GEMM calls per size, at "
          "least (in groups of ~20 ms), unless --max_seconds ends it first");
ABSL_FLAG(int, warmup, 1, "untimed steps before timing an MLP");
ABSL_FLAG(double, max_seconds, 10.0,
          "stop timing a measurement after this many seconds, even before "
          "--iters; GEMM sizes whose single call would take over half of "
          "this are skipped");
ABSL_FLAG(bool, pinned, true,
          "keep parameters, inputs and gradients in the backend's AllocHost "
          "memory (pinned for CUDA), as a worker does");
ABSL_FLAG(std::string, csv, "", "also write the results to this CSV file");

namespace asyncps {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Options {
  bool want_cpu = true;
  int cuda = 0;  // 0: no, 1: when usable, 2: required
  std::vector<std::vector<int>> models;
  std::vector<int> batches;
  std::vector<int> gemm_sizes;
};

// Positive integers separated by `sep`; the error names the flag.
absl::StatusOr<std::vector<int>> ParseInts(const std::string& text, char sep,
                                           const std::string& flag) {
  std::vector<int> out;
  if (text.empty()) return out;
  for (absl::string_view part : absl::StrSplit(text, sep)) {
    int v = 0;
    if (!absl::SimpleAtoi(part, &v) || v <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": \"", part, "\" in \"", text,
                       "\" is not a positive integer"));
    }
    out.push_back(v);
  }
  return out;
}

absl::StatusOr<Options> OptionsFromFlags() {
  Options o;
  const std::string device = absl::GetFlag(FLAGS_device);
  if (device == "auto") {
    o.cuda = 1;
  } else if (device == "cpu") {
    o.cuda = 0;
  } else if (device == "cuda") {
    o.want_cpu = false;
    o.cuda = 2;
  } else if (device == "both") {
    o.cuda = 2;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device must be auto, cpu, cuda or both, got \"", device, "\""));
  }
  for (absl::string_view m :
       absl::StrSplit(absl::GetFlag(FLAGS_models), ',', absl::SkipEmpty())) {
    absl::StatusOr<std::vector<int>> sizes =
        ParseInts(std::string(m), '-', "models");
    if (!sizes.ok()) return sizes.status();
    if (sizes->size() < 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--models: \"", m, "\" needs at least input and classes"));
    }
    o.models.push_back(*sizes);
  }
  absl::StatusOr<std::vector<int>> batches =
      ParseInts(absl::GetFlag(FLAGS_batches), ',', "batches");
  if (!batches.ok()) return batches.status();
  o.batches = *batches;
  absl::StatusOr<std::vector<int>> gemm =
      ParseInts(absl::GetFlag(FLAGS_gemm_sizes), ',', "gemm_sizes");
  if (!gemm.ok()) return gemm.status();
  o.gemm_sizes = *gemm;
  if (absl::GetFlag(FLAGS_iters) < 1 || absl::GetFlag(FLAGS_warmup) < 0 ||
      !(absl::GetFlag(FLAGS_max_seconds) > 0) ||
      !(absl::GetFlag(FLAGS_peak_tflops) >= 0)) {
    return absl::InvalidArgumentError(
        "--iters must be >= 1, --warmup >= 0, --max_seconds > 0 and "
        "--peak_tflops >= 0");
  }
  return o;
}

struct Measurement {
  int steps = 0;
  double seconds = 0;
  double per_s = 0;   // examples/s (mlp) or calls/s (gemm)
  double tflops = 0;  // GEMM work per second
  double mean_loss = 0;
};

// Host floats from backend->AllocHost, or a std::vector when pinned memory
// is off. Owns the memory; the backend must outlive it.
class HostArray {
 public:
  static absl::StatusOr<std::unique_ptr<HostArray>> Make(Backend* backend,
                                                         size_t n,
                                                         bool pinned) {
    auto array = std::make_unique<HostArray>();
    if (pinned) {
      absl::StatusOr<HostBuffer> buf = HostBuffer::Make(backend, n);
      if (!buf.ok()) return buf.status();
      array->pinned_ = *std::move(buf);
      array->data_ = array->pinned_.data();
    } else {
      array->plain_.resize(n);
      array->data_ = array->plain_.data();
    }
    return array;
  }

  float* data() const { return data_; }

 private:
  HostBuffer pinned_;
  std::vector<float> plain_;
  float* data_ = nullptr;
};

// FLOPs of the GEMMs of one training step: forward X W, backward X^T dY
// and (except for the first layer) dY W^T, 2 m n k each.
double StepGemmFlops(const std::vector<int>& sizes, int batch) {
  double flops = 0;
  for (size_t l = 0; l + 1 < sizes.size(); ++l) {
    const double one = 2.0 * batch * sizes[l] * sizes[l + 1];
    flops += one * (l == 0 ? 2 : 3);
  }
  return flops;
}

absl::StatusOr<Measurement> MeasureMlp(const std::vector<int>& sizes, int batch,
                                       Backend* backend) {
  absl::StatusOr<std::unique_ptr<Mlp>> mlp = Mlp::Create(sizes, batch, backend);
  if (!mlp.ok()) return mlp.status();
  const bool pinned = absl::GetFlag(FLAGS_pinned);
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);

  std::vector<std::unique_ptr<HostArray>> arrays;
  auto host = [&](size_t n) -> absl::StatusOr<float*> {
    absl::StatusOr<std::unique_ptr<HostArray>> a =
        HostArray::Make(backend, n, pinned);
    if (!a.ok()) return a.status();
    arrays.push_back(*std::move(a));
    return arrays.back()->data();
  };
  std::vector<const float*> param_ptrs;
  std::vector<float*> grad_ptrs;
  for (const ParamInfo& p : (*mlp)->params()) {
    const size_t n = static_cast<size_t>(p.num_elements());
    absl::StatusOr<float*> param = host(n);
    if (!param.ok()) return param.status();
    absl::StatusOr<float*> grad = host(n);
    if (!grad.ok()) return grad.status();
    const float scale = p.is_bias ? 0.0f : 1.0f / std::sqrt(float(p.shape[0]));
    for (size_t i = 0; i < n; ++i) (*param)[i] = scale * unit(rng);
    param_ptrs.push_back(*param);
    grad_ptrs.push_back(*grad);
  }
  const size_t x_n = static_cast<size_t>(batch) * sizes.front();
  absl::StatusOr<float*> x = host(x_n);
  if (!x.ok()) return x.status();
  for (size_t i = 0; i < x_n; ++i) (*x)[i] = 0.5f + 0.5f * unit(rng);
  std::vector<int32_t> labels(batch);
  std::uniform_int_distribution<int32_t> pick(0, sizes.back() - 1);
  for (int32_t& l : labels) l = pick(rng);

  auto step = [&]() -> absl::StatusOr<SoftmaxXentResult> {
    absl::StatusOr<SoftmaxXentResult> r = (*mlp)->ComputeGradients(
        param_ptrs, *x, labels.data(), batch, grad_ptrs);
    if (r.ok() && !std::isfinite(r->mean_loss)) {
      return absl::InternalError(
          absl::StrCat(backend->name(), ": non-finite loss"));
    }
    return r;
  };
  for (int i = 0; i < absl::GetFlag(FLAGS_warmup); ++i) {
    absl::StatusOr<SoftmaxXentResult> r = step();
    if (!r.ok()) return r.status();
  }
  const int iters = absl::GetFlag(FLAGS_iters);
  const double max_seconds = absl::GetFlag(FLAGS_max_seconds);
  Measurement m;
  double loss_sum = 0;
  const Clock::time_point start = Clock::now();
  while (m.steps < iters && m.seconds < max_seconds) {
    absl::StatusOr<SoftmaxXentResult> r = step();
    if (!r.ok()) return r.status();
    loss_sum += r->mean_loss;
    ++m.steps;
    m.seconds = SecondsSince(start);
  }
  m.per_s = m.steps * batch / m.seconds;
  m.tflops = m.steps * StepGemmFlops(sizes, batch) / m.seconds / 1e12;
  m.mean_loss = loss_sum / m.steps;
  return m;
}

// n x n x n GEMMs. `expected_s` is the estimated time of one call (0 if
// unknown); sizes whose call would take over half of --max_seconds are not
// run (returns a zero Measurement).
absl::StatusOr<Measurement> MeasureGemm(int n, Backend* backend,
                                        double expected_s) {
  const double max_seconds = absl::GetFlag(FLAGS_max_seconds);
  Measurement m;
  if (expected_s > max_seconds / 2) return m;
  const size_t elems = static_cast<size_t>(n) * n;
  std::vector<DeviceBuffer> bufs;
  for (float value : {0.01f, 0.02f, 0.0f}) {
    absl::StatusOr<DeviceBuffer> buf = DeviceBuffer::Make(backend, elems);
    if (!buf.ok()) return buf.status();
    absl::Status s = backend->Fill(buf->data(), elems, value);
    if (!s.ok()) return s;
    bufs.push_back(*std::move(buf));
  }
  auto gemm = [&]() {
    return backend->Gemm(false, false, n, n, n, 1.0f, bufs[0].data(),
                         bufs[1].data(), 0.0f, bufs[2].data());
  };
  // One untimed call (it loads the cuBLAS kernels; its time, an
  // overestimate, sizes the groups), then calls in groups of ~20 ms so that
  // synchronizing costs little.
  const Clock::time_point t = Clock::now();
  absl::Status s = gemm();
  if (s.ok()) s = backend->Synchronize();
  if (!s.ok()) return s;
  const double one = std::max(SecondsSince(t), 1e-7);
  const int group = std::max(1, static_cast<int>(0.02 / one));
  const int iters = absl::GetFlag(FLAGS_iters);
  const Clock::time_point start = Clock::now();
  while (m.steps < iters && m.seconds < max_seconds) {
    for (int i = 0; i < group && s.ok(); ++i) s = gemm();
    if (s.ok()) s = backend->Synchronize();
    if (!s.ok()) return s;
    m.steps += group;
    m.seconds = SecondsSince(start);
  }
  m.per_s = m.steps / m.seconds;
  m.tflops = m.per_s * 2.0 * n * n * static_cast<double>(n) / 1e12;
  return m;
}

// CSV rows and the exit code, shared by both measurement kinds.
struct Report {
  std::string csv =
      "kind,model,batch,backend,steps,seconds,per_s,tflops,mean_loss\n";
  int exit_code = 0;
};

void PrintRatio(const std::string& prefix,
                const std::map<std::string, double>& rate) {
  auto cpu = rate.find("cpu"), cuda = rate.find("cuda");
  if (cpu != rate.end() && cuda != rate.end() && cpu->second > 0) {
    std::printf("%s ratio_cuda_over_cpu=%.2f\n", prefix.c_str(),
                cuda->second / cpu->second);
  } else if (cpu != rate.end() || cuda != rate.end()) {
    std::printf("%s ratio_cuda_over_cpu=n/a\n", prefix.c_str());
  }
  std::fflush(stdout);
}

void RunMlp(const Options& o, const std::vector<Backend*>& backends,
            Report* report) {
  for (const std::vector<int>& sizes : o.models) {
    const std::string model = absl::StrJoin(sizes, "-");
    for (int batch : o.batches) {
      const std::string prefix =
          absl::StrCat("mlp model=", model, " batch=", batch);
      std::map<std::string, double> rate;
      for (Backend* backend : backends) {
        const std::string kind = backend->name() == "cpu" ? "cpu" : "cuda";
        absl::StatusOr<Measurement> m = MeasureMlp(sizes, batch, backend);
        if (!m.ok()) {
          std::printf("%s backend=%s FAILED: %s\n", prefix.c_str(),
                      backend->name().c_str(), m.status().ToString().c_str());
          report->exit_code = 1;
          continue;
        }
        std::printf(
            "%s backend=%s steps=%d seconds=%.3f examples_per_s=%.1f "
            "gemm_tflops=%.3f mean_loss=%.4f\n",
            prefix.c_str(), backend->name().c_str(), m->steps, m->seconds,
            m->per_s, m->tflops, m->mean_loss);
        std::fflush(stdout);
        absl::StrAppend(&report->csv, "mlp,", model, ",", batch, ",",
                        backend->name(), ",", m->steps, ",", m->seconds, ",",
                        m->per_s, ",", m->tflops, ",", m->mean_loss, "\n");
        rate[kind] = m->per_s;
      }
      PrintRatio(prefix, rate);
    }
  }
}

void RunGemm(const Options& o, const std::vector<Backend*>& backends,
             Report* report) {
  const double peak = absl::GetFlag(FLAGS_peak_tflops);
  std::map<std::string, double> last_tflops;  // per backend, for estimates
  for (int n : o.gemm_sizes) {
    const std::string prefix = absl::StrCat("gemm n=", n);
    const double flops = 2.0 * n * n * static_cast<double>(n);
    std::map<std::string, double> rate;
    for (Backend* backend : backends) {
      const std::string kind = backend->name() == "cpu" ? "cpu" : "cuda";
      const double expected_s =
          last_tflops.count(kind) ? flops / (last_tflops[kind] * 1e12) : 0;
      absl::StatusOr<Measurement> m = MeasureGemm(n, backend, expected_s);
      if (!m.ok()) {
        std::printf("%s backend=%s FAILED: %s\n", prefix.c_str(),
                    backend->name().c_str(), m.status().ToString().c_str());
        report->exit_code = 1;
        continue;
      }
      if (m->steps == 0) {
        std::printf(
            "%s backend=%s skipped: one call would take ~%.1f s > "
            "--max_seconds / 2\n",
            prefix.c_str(), backend->name().c_str(), expected_s);
        continue;
      }
      last_tflops[kind] = m->tflops;
      std::string fraction;
      if (peak > 0 && kind == "cuda") {
        fraction = absl::StrCat(" peak_fraction=", m->tflops / peak);
      }
      std::printf("%s backend=%s calls=%d seconds=%.3f tflops=%.3f%s\n",
                  prefix.c_str(), backend->name().c_str(), m->steps, m->seconds,
                  m->tflops, fraction.c_str());
      std::fflush(stdout);
      absl::StrAppend(&report->csv, "gemm,", n, ",", n, ",", backend->name(),
                      ",", m->steps, ",", m->seconds, ",", m->per_s, ",",
                      m->tflops, ",\n");
      rate[kind] = m->tflops;
    }
    PrintRatio(prefix, rate);
  }
}

int Run(const Options& o) {
  std::unique_ptr<Backend> cpu, cuda;
  std::vector<Backend*> backends;
  if (o.want_cpu) {
    cpu = MakeCpuBackend();
    backends.push_back(cpu.get());
  }
  if (o.cuda > 0) {
    absl::StatusOr<std::unique_ptr<Backend>> made = MakeCudaBackend(0);
    if (made.ok()) {
      cuda = *std::move(made);
      backends.push_back(cuda.get());
      std::printf("cuda: %s\n", cuda->name().c_str());
    } else {
      std::printf("cuda: unavailable (%s)\n",
                  std::string(made.status().message()).c_str());
      if (o.cuda == 2) {
        std::fprintf(stderr, "backend_bench: --device=%s needs a usable GPU\n",
                     absl::GetFlag(FLAGS_device).c_str());
        return 1;
      }
    }
  }
  std::printf("iters<=%d warmup=%d max_seconds=%g pinned=%d peak_tflops=%g\n",
              absl::GetFlag(FLAGS_iters), absl::GetFlag(FLAGS_warmup),
              absl::GetFlag(FLAGS_max_seconds), absl::GetFlag(FLAGS_pinned),
              absl::GetFlag(FLAGS_peak_tflops));
  std::fflush(stdout);

  Report report;
  RunMlp(o, backends, &report);
  RunGemm(o, backends, &report);

  const std::string csv_path = absl::GetFlag(FLAGS_csv);
  if (!csv_path.empty()) {
    std::ofstream out(csv_path);
    out << report.csv;
    if (!out) {
      std::fprintf(stderr, "backend_bench: cannot write %s\n",
                   csv_path.c_str());
      report.exit_code = 1;
    }
  }
  return report.exit_code;
}

}  // namespace
}  // namespace asyncps

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "CPU vs CUDA backend throughput: MLP training steps and GEMM FLOP/s.");
  absl::ParseCommandLine(argc, argv);
  absl::StatusOr<asyncps::Options> options = asyncps::OptionsFromFlags();
  if (!options.ok()) {
    std::fprintf(stderr, "backend_bench: %s\n",
                 std::string(options.status().message()).c_str());
    return 2;
  }
  return asyncps::Run(*options);
}
