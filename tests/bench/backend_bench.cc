// backend_bench: gradient-computation throughput of the CPU and CUDA
// backends, measured through the worker's own path (Mlp::ComputeGradients:
// parameter upload, forward, backward, gradient download) on random data.
//
// For each model it prints one line per backend and the cuda/cpu ratio:
//   model=784-256-128-10 batch=128 backend=cpu steps=50 seconds=1.234
//     examples_per_s=5187.2 mean_loss=2.41
//   model=784-256-128-10 batch=128 ratio_cuda_over_cpu=12.3
// and, with --csv, the same numbers as CSV. Without a usable CUDA device it
// prints "cuda: unavailable (<reason>)", reports the CPU numbers and exits 0.
// Exits 1 if an available backend fails a step.

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/backend.h"
#include "worker/mlp.h"

ABSL_FLAG(int, iters, 50, "timed steps per (model, backend), at most");
ABSL_FLAG(int, warmup, 3, "untimed steps before timing");
ABSL_FLAG(double, max_seconds, 20.0,
          "stop timing a (model, backend) after this many seconds, even "
          "before --iters steps");
ABSL_FLAG(bool, pinned, true,
          "keep parameters, inputs and gradients in the backend's AllocHost "
          "memory (pinned for CUDA), as a fast worker would");
ABSL_FLAG(std::string, csv, "", "also write the results to this CSV file");

namespace asyncps {
namespace {

struct ModelSpec {
  std::vector<int> sizes;
  int batch;
};

struct Measurement {
  int steps = 0;
  double seconds = 0;
  double examples_per_s = 0;
  double mean_loss = 0;
};

// Host floats from backend->AllocHost (or a std::vector when pinned is off
// or AllocHost fails). Owns the memory; the backend must outlive it.
class HostArray {
 public:
  HostArray(Backend* backend, size_t n, bool pinned)
      : backend_(pinned ? backend : nullptr) {
    if (backend_ != nullptr) data_ = backend_->AllocHost(n);
    if (data_ == nullptr) {
      backend_ = nullptr;
      fallback_.resize(n);
      data_ = fallback_.data();
    }
  }
  ~HostArray() {
    if (backend_ != nullptr) backend_->FreeHost(data_);
  }
  HostArray(const HostArray&) = delete;
  HostArray& operator=(const HostArray&) = delete;

  float* data() const { return data_; }

 private:
  Backend* backend_;
  float* data_ = nullptr;
  std::vector<float> fallback_;
};

std::string ModelName(const ModelSpec& spec) {
  return absl::StrJoin(spec.sizes, "-");
}

absl::StatusOr<Measurement> Measure(const ModelSpec& spec, Backend* backend) {
  absl::StatusOr<std::unique_ptr<Mlp>> mlp =
      Mlp::Create(spec.sizes, spec.batch, backend);
  if (!mlp.ok()) return mlp.status();
  const bool pinned = absl::GetFlag(FLAGS_pinned);
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);

  std::vector<std::unique_ptr<HostArray>> params, grads;
  std::vector<const float*> param_ptrs;
  std::vector<float*> grad_ptrs;
  for (const ParamInfo& p : (*mlp)->params()) {
    const size_t n = static_cast<size_t>(p.num_elements());
    params.push_back(std::make_unique<HostArray>(backend, n, pinned));
    grads.push_back(std::make_unique<HostArray>(backend, n, pinned));
    const float scale = p.is_bias ? 0.0f : 1.0f / std::sqrt(float(p.shape[0]));
    for (size_t i = 0; i < n; ++i) params.back()->data()[i] = scale * unit(rng);
    param_ptrs.push_back(params.back()->data());
    grad_ptrs.push_back(grads.back()->data());
  }
  const size_t x_n = static_cast<size_t>(spec.batch) * spec.sizes.front();
  HostArray x(backend, x_n, pinned);
  for (size_t i = 0; i < x_n; ++i) x.data()[i] = 0.5f + 0.5f * unit(rng);
  std::vector<int32_t> labels(spec.batch);
  std::uniform_int_distribution<int32_t> pick(0, spec.sizes.back() - 1);
  for (int32_t& l : labels) l = pick(rng);

  auto step = [&]() -> absl::StatusOr<SoftmaxXentResult> {
    absl::StatusOr<SoftmaxXentResult> r = (*mlp)->ComputeGradients(
        param_ptrs, x.data(), labels.data(), spec.batch, grad_ptrs);
    if (r.ok() && !std::isfinite(r->mean_loss)) {
      return absl::InternalError(
          absl::StrCat(backend->name(), ": non-finite loss (backend error)"));
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
  const auto start = std::chrono::steady_clock::now();
  while (m.steps < iters) {
    absl::StatusOr<SoftmaxXentResult> r = step();
    if (!r.ok()) return r.status();
    loss_sum += r->mean_loss;
    ++m.steps;
    m.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    if (m.seconds >= max_seconds) break;
  }
  m.examples_per_s = m.seconds > 0 ? m.steps * spec.batch / m.seconds : 0;
  m.mean_loss = m.steps > 0 ? loss_sum / m.steps : 0;
  return m;
}

int Run() {
  const std::vector<ModelSpec> models = {{{784, 256, 128, 10}, 128},
                                         {{784, 4096, 4096, 10}, 512}};
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  std::unique_ptr<Backend> cuda;
  absl::StatusOr<std::unique_ptr<Backend>> made = MakeCudaBackend(0);
  if (made.ok()) {
    cuda = *std::move(made);
    std::printf("cuda: %s\n", cuda->name().c_str());
  } else {
    std::printf("cuda: unavailable (%s)\n",
                std::string(made.status().message()).c_str());
  }
  std::printf("iters<=%d warmup=%d max_seconds=%g pinned=%d\n",
              absl::GetFlag(FLAGS_iters), absl::GetFlag(FLAGS_warmup),
              absl::GetFlag(FLAGS_max_seconds), absl::GetFlag(FLAGS_pinned));
  std::fflush(stdout);

  std::string csv =
      "model,batch,backend,steps,seconds,examples_per_s,mean_loss\n";
  int exit_code = 0;
  for (const ModelSpec& spec : models) {
    double cpu_rate = 0, cuda_rate = 0;
    for (Backend* backend : {cpu.get(), cuda.get()}) {
      if (backend == nullptr) continue;
      absl::StatusOr<Measurement> m = Measure(spec, backend);
      if (!m.ok()) {
        std::printf("model=%s batch=%d backend=%s FAILED: %s\n",
                    ModelName(spec).c_str(), spec.batch,
                    backend->name().c_str(), m.status().ToString().c_str());
        exit_code = 1;
        continue;
      }
      std::printf(
          "model=%s batch=%d backend=%s steps=%d seconds=%.3f "
          "examples_per_s=%.1f mean_loss=%.4f\n",
          ModelName(spec).c_str(), spec.batch, backend->name().c_str(),
          m->steps, m->seconds, m->examples_per_s, m->mean_loss);
      std::fflush(stdout);
      absl::StrAppend(&csv, ModelName(spec), ",", spec.batch, ",",
                      backend->name(), ",", m->steps, ",", m->seconds, ",",
                      m->examples_per_s, ",", m->mean_loss, "\n");
      (backend == cpu.get() ? cpu_rate : cuda_rate) = m->examples_per_s;
    }
    if (cpu_rate > 0 && cuda_rate > 0) {
      std::printf("model=%s batch=%d ratio_cuda_over_cpu=%.2f\n",
                  ModelName(spec).c_str(), spec.batch, cuda_rate / cpu_rate);
    } else {
      std::printf("model=%s batch=%d ratio_cuda_over_cpu=n/a\n",
                  ModelName(spec).c_str(), spec.batch);
    }
    std::fflush(stdout);
  }

  const std::string csv_path = absl::GetFlag(FLAGS_csv);
  if (!csv_path.empty()) {
    std::ofstream out(csv_path);
    out << csv;
    if (!out) {
      std::fprintf(stderr, "cannot write %s\n", csv_path.c_str());
      exit_code = 1;
    }
  }
  return exit_code;
}

}  // namespace
}  // namespace asyncps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return asyncps::Run();
}
