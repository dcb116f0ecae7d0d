// Parity spec for the CUDA backend: every op, on random inputs (odd sizes,
// all GEMM transposes), agrees with the CPU reference backend within the
// fp32 rounding bounds derived next to each comparison; a full MLP gradient
// step agrees too. Errors: bad arguments are rejected exactly as on the CPU,
// a failed allocation is RESOURCE_EXHAUSTED naming cudaErrorMemoryAllocation,
// and a kernel that faults is reported, with its CUDA error name, by the
// next synchronizing call.
//
// Without a usable CUDA device (or in a build without --config=cuda) the
// cases that need one return early, the others (MakeCudaBackend's
// UNAVAILABLE answers) still run, and the binary ends with the line
// "ASYNCPS_SKIPPED: <reason>" (exit 0 when those passed). With
// ASYNCPS_REQUIRE_CUDA=1 in the environment (tests/gpu/run_bundle.sh on a
// GPU machine) a missing or unusable device fails instead.

#include <algorithm>
#define CATCH_CONFIG_RUNNER
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <catch2/catch.hpp>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "models/mlp.h"
#include "tests/testing/require_ok.h"

namespace asyncps {
namespace {

constexpr double kEps = FLT_EPSILON;  // 2^-23; unit roundoff u = kEps / 2

// The CUDA backend on device 0, or null when there is none (main() then
// reports the run as skipped, or has already failed it when a device is
// required). Asserts that the only acceptable failure is UNAVAILABLE.
std::unique_ptr<Backend> CudaOrSkip() {
  absl::StatusOr<std::unique_ptr<Backend>> cuda = MakeCudaBackend(0);
  if (!cuda.ok()) {
    INFO(cuda.status().ToString());
    REQUIRE(cuda.status().code() == absl::StatusCode::kUnavailable);
    return nullptr;
  }
  REQUIRE(*cuda != nullptr);
  REQUIRE((*cuda)->name() == "cuda:0");
  return *std::move(cuda);
}

std::vector<float> RandomVector(size_t n, std::mt19937_64& rng,
                                float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

DeviceBuffer Alloc(Backend* be, size_t n) {
  absl::StatusOr<DeviceBuffer> buf = DeviceBuffer::Make(be, n);
  REQUIRE_OK(buf.status());
  return *std::move(buf);
}

DeviceBuffer Upload(Backend* be, const std::vector<float>& host) {
  DeviceBuffer buf = Alloc(be, host.size());
  REQUIRE_OK(be->CopyToDevice(buf.data(), host.data(), host.size()));
  return buf;
}

std::vector<float> Download(Backend* be, const DeviceBuffer& buf) {
  std::vector<float> host(buf.size());
  REQUIRE_OK(be->CopyToHost(host.data(), buf.data(), host.size()));
  return host;
}

SoftmaxXentResult Xent(Backend* be, const float* logits, const int32_t* labels,
                       int rows, int cols, float* dlogits) {
  absl::StatusOr<SoftmaxXentResult> r =
      be->SoftmaxCrossEntropy(logits, labels, rows, cols, dlogits);
  REQUIRE_OK(r.status());
  return *r;
}

// Checks |cuda - cpu| <= tol elementwise; reports the first few misses
// with index, both values and the tolerance.
void CheckClose(const std::vector<float>& cuda, const std::vector<float>& cpu,
                const std::vector<double>& tol, const std::string& what) {
  REQUIRE(cuda.size() == cpu.size());
  int reported = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(cuda[i]) - cpu[i]);
    if (!(diff <= tol[i]) && reported < 5) {  // !(<=) also catches NaN
      ++reported;
      FAIL_CHECK(what << " [" << i << "]: cuda " << cuda[i] << " cpu " << cpu[i]
                      << " |diff| " << diff << " > tol " << tol[i]);
    }
  }
  CHECK(reported == 0);
}

TEST_CASE("MakeCudaBackend rejects device indices that do not exist",
          "[cuda_parity]") {
  for (int device : {-1, 1 << 20}) {
    absl::StatusOr<std::unique_ptr<Backend>> cuda = MakeCudaBackend(device);
    REQUIRE_FALSE(cuda.ok());
    CHECK(cuda.status().code() == absl::StatusCode::kUnavailable);
    CHECK_FALSE(cuda.status().message().empty());
  }
  // Device 0 either works or is UNAVAILABLE with a reason.
  CudaOrSkip();
}

TEST_CASE("CUDA copies, pinned host memory and Fill round-trip exactly",
          "[cuda_parity]") {
  std::unique_ptr<Backend> cuda = CudaOrSkip();
  if (cuda == nullptr) return;
  std::mt19937_64 rng(11);
  for (size_t n : {size_t{1}, size_t{31}, size_t{1000003}}) {
    std::vector<float> src = RandomVector(n, rng);
    absl::StatusOr<HostBuffer> pinned = HostBuffer::Make(cuda.get(), n);
    REQUIRE_OK(pinned.status());
    REQUIRE(pinned->data() != nullptr);
    float* p = pinned->data();
    std::copy(src.begin(), src.end(), p);
    DeviceBuffer buf = Alloc(cuda.get(), n);
    REQUIRE(buf.data() != nullptr);
    REQUIRE_OK(cuda->CopyToDevice(buf.data(), p, n));
    REQUIRE_OK(cuda->Synchronize());
    std::fill(p, p + n, 0.0f);
    REQUIRE_OK(cuda->CopyToHost(p, buf.data(), n));
    CHECK(std::equal(src.begin(), src.end(), p));

    // Fill is a store of one value: exact on both backends.
    std::unique_ptr<Backend> cpu = MakeCpuBackend();
    DeviceBuffer cpu_buf = Alloc(cpu.get(), n);
    REQUIRE_OK(cpu->Fill(cpu_buf.data(), n, -3.25f));
    REQUIRE_OK(cuda->Fill(buf.data(), n, -3.25f));
    CHECK(Download(cuda.get(), buf) == Download(cpu.get(), cpu_buf));
  }
  REQUIRE_OK(cuda->Free(nullptr));
  REQUIRE_OK(cuda->FreeHost(nullptr));
  absl::StatusOr<float*> none = cuda->Alloc(0);
  REQUIRE_OK(none.status());
  CHECK(*none == nullptr);
}

struct GemmShape {
  int m, n, k;
};

TEST_CASE("CUDA Gemm matches the CPU for all transposes and odd sizes",
          "[cuda_parity][gemm]") {
  std::unique_ptr<Backend> cuda = CudaOrSkip();
  if (cuda == nullptr) return;
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  std::mt19937_64 rng(12);
  const std::vector<GemmShape> shapes = {
      {1, 1, 1},       {7, 5, 3},      {33, 17, 65}, {64, 256, 784},
      {129, 257, 300}, {128, 10, 128}, {1, 513, 31}, {5, 3, 0}};
  const std::vector<std::pair<float, float>> alpha_beta = {
      {1.0f, 0.0f}, {0.5f, 1.5f}, {-2.0f, 1.0f}};
  for (const GemmShape& s : shapes) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (const auto& [alpha, beta] : alpha_beta) {
          const std::vector<float> a = RandomVector(size_t(s.m) * s.k, rng);
          const std::vector<float> b = RandomVector(size_t(s.k) * s.n, rng);
          const std::vector<float> c = RandomVector(size_t(s.m) * s.n, rng);
          DeviceBuffer a_cpu = Upload(cpu.get(), a),
                       b_cpu = Upload(cpu.get(), b),
                       c_cpu = Upload(cpu.get(), c);
          DeviceBuffer a_gpu = Upload(cuda.get(), a),
                       b_gpu = Upload(cuda.get(), b);
          // With beta == 0, C must not be read: the GPU's C starts as NaN.
          DeviceBuffer c_gpu =
              beta == 0.0f
                  ? Upload(cuda.get(), std::vector<float>(c.size(), NAN))
                  : Upload(cuda.get(), c);
          REQUIRE_OK(cpu->Gemm(ta, tb, s.m, s.n, s.k, alpha, a_cpu.data(),
                               b_cpu.data(), beta, c_cpu.data()));
          REQUIRE_OK(cuda->Gemm(ta, tb, s.m, s.n, s.k, alpha, a_gpu.data(),
                                b_gpu.data(), beta, c_gpu.data()));
          // Tolerance. Each backend computes every C[i][j] as an fp32 dot
          // product of length k (any summation order, any blocking, with or
          // without FMA), then alpha and beta steps; the classical bound
          // |fl(x.y) - x.y| <= gamma_k |x|.|y|, gamma_k = k u / (1 - k u),
          // holds for every order, so each result is within gamma_{k+2} *
          // bound of the exact value and the two within 2 gamma_{k+2} * bound
          // ~= (k + 2) * eps * bound, with bound = |alpha| sum_l |A_il||B_lj|
          // + |beta| |C_ij|. (cuBLAS runs in plain fp32 here, no TF32.)
          std::vector<double> tol(c.size());
          for (int i = 0; i < s.m; ++i) {
            for (int j = 0; j < s.n; ++j) {
              double bound = 0;
              for (int l = 0; l < s.k; ++l) {
                const double av =
                    ta ? a[size_t(l) * s.m + i] : a[size_t(i) * s.k + l];
                const double bv =
                    tb ? b[size_t(j) * s.k + l] : b[size_t(l) * s.n + j];
                bound += std::fabs(av * bv);
              }
              bound = std::fabs(alpha) * bound +
                      std::fabs(beta) * std::fabs(c[size_t(i) * s.n + j]);
              tol[size_t(i) * s.n + j] =
                  1.01 * (s.k + 2) * kEps * bound + 1e-30;
            }
          }
          INFO("m=" << s.m << " n=" << s.n << " k=" << s.k << " ta=" << ta
                    << " tb=" << tb << " alpha=" << alpha << " beta=" << beta);
          CheckClose(Download(cuda.get(), c_gpu), Download(cpu.get(), c_cpu),
                     tol, "C");
        }
      }
    }
  }
}

TEST_CASE("CUDA BiasActivation and ReluBackward match the CPU exactly",
          "[cuda_parity]") {
  std::unique_ptr<Backend> cuda = CudaOrSkip();
  if (cuda == nullptr) return;
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  std::mt19937_64 rng(13);
  // One fp32 add (correctly rounded on both) and a max: bitwise equal up to
  // the sign of zero, which == ignores.
  for (auto [rows, cols] : std::vector<std::pair<int, int>>{
           {1, 1}, {3, 7}, {64, 256}, {129, 1000}, {513, 33}}) {
    for (bool relu : {false, true}) {
      INFO("rows=" << rows << " cols=" << cols << " relu=" << relu);
      const std::vector<float> y = RandomVector(size_t(rows) * cols, rng);
      const std::vector<float> bias = RandomVector(cols, rng);
      DeviceBuffer y_cpu = Upload(cpu.get(), y),
                   b_cpu = Upload(cpu.get(), bias);
      DeviceBuffer y_gpu = Upload(cuda.get(), y),
                   b_gpu = Upload(cuda.get(), bias);
      REQUIRE_OK(
          cpu->BiasActivation(y_cpu.data(), b_cpu.data(), rows, cols, relu));
      REQUIRE_OK(
          cuda->BiasActivation(y_gpu.data(), b_gpu.data(), rows, cols, relu));
      CHECK(Download(cuda.get(), y_gpu) == Download(cpu.get(), y_cpu));
    }
  }
  for (size_t n : {size_t{1}, size_t{1000}, size_t{262147}}) {
    INFO("n=" << n);
    std::vector<float> y = RandomVector(n, rng);
    for (size_t i = 0; i < n; i += 7) y[i] = 0.0f;  // boundary: grad blocked
    for (float& v : y) v = std::max(v, 0.0f);       // a ReLU output
    const std::vector<float> dy = RandomVector(n, rng);
    DeviceBuffer y_cpu = Upload(cpu.get(), y), d_cpu = Upload(cpu.get(), dy);
    DeviceBuffer y_gpu = Upload(cuda.get(), y), d_gpu = Upload(cuda.get(), dy);
    REQUIRE_OK(cpu->ReluBackward(d_cpu.data(), y_cpu.data(), n));
    REQUIRE_OK(cuda->ReluBackward(d_gpu.data(), y_gpu.data(), n));
    CHECK(Download(cuda.get(), d_gpu) == Download(cpu.get(), d_cpu));
  }
}

TEST_CASE("CUDA ColumnSum matches the CPU", "[cuda_parity]") {
  std::unique_ptr<Backend> cuda = CudaOrSkip();
  if (cuda == nullptr) return;
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  std::mt19937_64 rng(14);
  for (auto [rows, cols] : std::vector<std::pair<int, int>>{{0, 5},
                                                            {1, 1},
                                                            {2, 10},
                                                            {7, 33},
                                                            {64, 256},
                                                            {513, 1025},
                                                            {1000, 10}}) {
    INFO("rows=" << rows << " cols=" << cols);
    // One spare element so that rows == 0 still has a (non-null) buffer.
    const std::vector<float> x = RandomVector(size_t(rows) * cols + 1, rng);
    DeviceBuffer x_cpu = Upload(cpu.get(), x), x_gpu = Upload(cuda.get(), x);
    // Outputs start as garbage: ColumnSum overwrites, it does not add.
    DeviceBuffer o_cpu = Upload(cpu.get(), std::vector<float>(cols, 7.0f));
    DeviceBuffer o_gpu = Upload(cuda.get(), std::vector<float>(cols, 7.0f));
    REQUIRE_OK(cpu->ColumnSum(x_cpu.data(), rows, cols, o_cpu.data()));
    REQUIRE_OK(cuda->ColumnSum(x_gpu.data(), rows, cols, o_gpu.data()));
    // Both are fp32 sums of `rows` terms in different orders: each within
    // gamma_{rows-1} sum_r |x_rc| of the exact sum, so within
    // rows * eps * sum_r |x_rc| of each other.
    std::vector<double> tol(cols);
    for (int c = 0; c < cols; ++c) {
      double abs_sum = 0;
      for (int r = 0; r < rows; ++r)
        abs_sum += std::fabs(x[size_t(r) * cols + c]);
      tol[c] = 1.01 * rows * kEps * abs_sum;
    }
    CheckClose(Download(cuda.get(), o_gpu), Download(cpu.get(), o_cpu), tol,
               "column sum");
  }
}

TEST_CASE("CUDA SoftmaxCrossEntropy matches the CPU, also for huge logits",
          "[cuda_parity][softmax]") {
  std::unique_ptr<Backend> cuda = CudaOrSkip();
  if (cuda == nullptr) return;
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  std::mt19937_64 rng(15);
  struct Case {
    int rows, cols;
    float scale, offset;  // logits uniform in offset +- scale
  };
  const std::vector<Case> cases = {
      {1, 1, 1, 0},    {1, 10, 1, 0},      {64, 10, 3, 0},
      {7, 33, 1, 0},   {128, 1000, 5, 0},  {33, 2049, 2, 0},
      {64, 10, 30, 0}, {64, 10, 20, 1000}, {50, 37, 40, -3000}};
  for (const Case& k : cases) {
    for (int mode = 0; mode < 3; ++mode) {  // 0 no grad, 1 grad, 2 in place
      INFO("rows=" << k.rows << " cols=" << k.cols << " scale=" << k.scale
                   << " offset=" << k.offset << " mode=" << mode);
      const std::vector<float> z = RandomVector(
          size_t(k.rows) * k.cols, rng, k.offset - k.scale, k.offset + k.scale);
      std::vector<int32_t> labels(k.rows);
      std::uniform_int_distribution<int32_t> pick(0, k.cols - 1);
      for (int32_t& l : labels) l = pick(rng);
      DeviceBuffer z_cpu = Upload(cpu.get(), z), z_gpu = Upload(cuda.get(), z);
      DeviceBuffer d_cpu = Alloc(cpu.get(), z.size());
      DeviceBuffer d_gpu = Alloc(cuda.get(), z.size());
      float* d_gpu_ptr = mode == 0   ? nullptr
                         : mode == 1 ? d_gpu.data()
                                     : z_gpu.data();
      const SoftmaxXentResult want =
          Xent(cpu.get(), z_cpu.data(), labels.data(), k.rows, k.cols,
               mode == 0 ? nullptr : d_cpu.data());
      const SoftmaxXentResult got = Xent(
          cuda.get(), z_gpu.data(), labels.data(), k.rows, k.cols, d_gpu_ptr);

      // The CPU works in double; the GPU in fp32 after max subtraction. Per
      // row: z_label - zmax is rounded once (<= u * spread, spread = max -
      // min of the row's logits); the sum of cols terms exp(z - zmax) in
      // (0, 1] has relative error <= (cols + 2) eps (expf is within 2 ulp,
      // then cols - 1 additions), which logf turns into an absolute error of
      // the same size plus one rounding of the log. So |loss difference| <=
      // eps * (cols + 3 + spread + log(cols)); the mean keeps the max bound.
      // Doubled for the double-side and reduction roundings.
      double spread = 0;
      for (int r = 0; r < k.rows; ++r) {
        const auto row = z.begin() + size_t(r) * k.cols;
        const auto [lo, hi] = std::minmax_element(row, row + k.cols);
        spread = std::max(spread, double(*hi) - double(*lo));
      }
      const double loss_tol =
          2 * kEps * (k.cols + 3 + spread + std::log(double(k.cols)) + 1);
      CHECK(std::isfinite(got.mean_loss));
      CHECK(std::fabs(got.mean_loss - want.mean_loss) <= loss_tol);
      // Argmax on identical fp32 inputs, ties to the lowest index: exact.
      CHECK(got.correct == want.correct);
      if (mode == 0) continue;
      // Gradient: p = exp(z - zmax - log_sum) with an argument error of at
      // most eps * (cols + 4 + spread), hence that relative error in p <= 1,
      // then the 1/rows scaling; doubled as above.
      const double grad_tol = 2 * kEps * (k.cols + 5 + spread) / k.rows + 1e-30;
      CheckClose(
          mode == 1 ? Download(cuda.get(), d_gpu) : Download(cuda.get(), z_gpu),
          Download(cpu.get(), d_cpu), std::vector<double>(z.size(), grad_tol),
          "dlogits");
    }
  }
}

TEST_CASE("CUDA rejects bad arguments exactly as the CPU and keeps working",
          "[cuda_parity][errors]") {
  std::unique_ptr<Backend> cuda = CudaOrSkip();
  if (cuda == nullptr) return;
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  std::mt19937_64 rng(16);
  const std::vector<float> z = RandomVector(4 * 10, rng);
  DeviceBuffer z_gpu = Upload(cuda.get(), z), z_cpu = Upload(cpu.get(), z);
  std::vector<int32_t> labels = {1, 2, 3, 4};
  const SoftmaxXentResult ok =
      Xent(cuda.get(), z_gpu.data(), labels.data(), 4, 10, nullptr);
  CHECK(std::isfinite(ok.mean_loss));

  // Each bad call, on each backend (with that backend's buffer).
  using BadCall = std::function<absl::Status(Backend*, float*)>;
  const std::vector<std::pair<std::string, BadCall>> calls = {
      {"negative Gemm size",
       [](Backend* be, float* p) {
         return be->Gemm(false, false, -1, 2, 3, 1.0f, p, p, 0.0f, p);
       }},
      {"null Gemm operand",
       [](Backend* be, float* p) {
         return be->Gemm(false, true, 2, 2, 3, 1.0f, nullptr, p, 0.0f, p);
       }},
      {"null Fill",
       [](Backend* be, float*) { return be->Fill(nullptr, 5, 1); }},
      {"negative BiasActivation size",
       [](Backend* be, float* p) {
         return be->BiasActivation(p, p, -4, 10, true);
       }},
      {"null ReluBackward input",
       [](Backend* be, float* p) { return be->ReluBackward(p, nullptr, 3); }},
      {"null ColumnSum output",
       [](Backend* be, float* p) { return be->ColumnSum(p, 4, 10, nullptr); }},
      {"null CopyToHost destination",
       [](Backend* be, float* p) { return be->CopyToHost(nullptr, p, 3); }},
      {"label out of range",
       [](Backend* be, float* p) {
         const int32_t bad[] = {1, 2, 10, 4};
         return be->SoftmaxCrossEntropy(p, bad, 4, 10, nullptr).status();
       }},
  };
  for (const auto& [what, call] : calls) {
    INFO(what);
    const absl::Status on_cuda = call(cuda.get(), z_gpu.data());
    const absl::Status on_cpu = call(cpu.get(), z_cpu.data());
    CHECK(absl::IsInvalidArgument(on_cuda));
    CHECK(on_cuda == on_cpu);  // same code and message
  }
  // Nothing was issued: the data and the backend are unchanged.
  CHECK(Download(cuda.get(), z_gpu) == z);
  CHECK(
      Xent(cuda.get(), z_gpu.data(), labels.data(), 4, 10, nullptr).mean_loss ==
      ok.mean_loss);
}

TEST_CASE("a failed CUDA allocation is RESOURCE_EXHAUSTED with its CUDA name",
          "[cuda_parity][errors]") {
  std::unique_ptr<Backend> cuda = CudaOrSkip();
  if (cuda == nullptr) return;
  // 2^40 floats = 4 TiB: more than any GPU's memory and any pinnable RAM.
  const size_t huge = size_t{1} << 40;
  absl::StatusOr<float*> d = cuda->Alloc(huge);
  INFO(d.status().ToString());
  CHECK(absl::IsResourceExhausted(d.status()));
  CHECK(d.status().message().find("Alloc(1099511627776 floats): cudaMalloc: "
                                  "cudaErrorMemoryAllocation") == 0);
  absl::StatusOr<float*> h = cuda->AllocHost(huge);
  INFO(h.status().ToString());
  CHECK(!h.ok());
  CHECK(h.status().message().find("AllocHost(") == 0);
  CHECK(h.status().message().find("cudaMallocHost: ") !=
        absl::string_view::npos);
  // The failure is not sticky and not reported again by the next launch.
  DeviceBuffer buf = Alloc(cuda.get(), 1000);
  REQUIRE_OK(cuda->Fill(buf.data(), 1000, 2.0f));
  CHECK(Download(cuda.get(), buf) == std::vector<float>(1000, 2.0f));
}

// The fault child (see main): a kernel that writes through a bad device
// pointer. Prints the status of the launch and of the next synchronizing
// call, one per line; exits 0 when it got that far.
int RunFaultChild() {
  absl::StatusOr<std::unique_ptr<Backend>> cuda = MakeCudaBackend(0);
  if (!cuda.ok()) {
    std::printf("no backend: %s\n", cuda.status().ToString().c_str());
    return 1;
  }
  // A non-null pointer no allocation can have: the kernel faults.
  float* bad = reinterpret_cast<float*>(uintptr_t{0x100});
  const absl::Status launch = (*cuda)->Fill(bad, 1 << 20, 1.0f);
  const absl::Status sync = (*cuda)->Synchronize();
  std::printf("launch: %s\nsync: %s\n", launch.ToString().c_str(),
              sync.ToString().c_str());
  return 0;
}

// argv[0] of this process, for RunSelf.
std::string g_argv0;

// Runs this test binary again with the single argument `arg`, without a
// shell; returns its exit status (-1 if it did not exit normally) and its
// stdout + stderr in *out. When this process was started through the
// dynamic loader ("ld-linux-x86-64.so.2 cuda_parity_test", as
// tests/gpu/run_bundle.sh does on a machine with an older glibc),
// /proc/self/exe is the loader, and the child is started the same way.
int RunSelf(const std::string& arg, std::string* out) {
  std::array<char, 4096> buf{};
  const ssize_t len = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (len <= 0) return -1;
  const std::string exe(buf.data(), len);
  const std::string base = exe.substr(exe.rfind('/') + 1);
  std::vector<std::string> args = {exe};
  if (base.rfind("ld-", 0) == 0) args.push_back(g_argv0);
  args.push_back(arg);
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(exe.c_str(), argv.data());
    _exit(127);
  }
  close(fds[1]);
  std::array<char, 512> chunk;
  ssize_t got;
  while ((got = read(fds[0], chunk.data(), chunk.size())) > 0) {
    out->append(chunk.data(), got);
  }
  close(fds[0]);
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

TEST_CASE("a faulting kernel is reported by the next synchronizing call",
          "[cuda_parity][errors]") {
  // The fault leaves the CUDA context unusable (a sticky error), so it runs
  // in a child process: this binary again, with --asyncps_fault_child.
  std::string out;
  const int rc = RunSelf("--asyncps_fault_child", &out);
  INFO("child output:\n" << out);
  if (CudaOrSkip() == nullptr) {
    // No GPU: the child starts, finds none and says so.
    CHECK(rc == 1);
    CHECK(out.find("no backend: UNAVAILABLE: ") == 0);
    return;
  }
  CHECK(rc == 0);
  // The launch itself succeeds (errors of running kernels are
  // asynchronous); Synchronize names itself, the call and the CUDA error.
  CHECK(out.find("launch: OK\n") != std::string::npos);
  CHECK(out.find("sync: INTERNAL: Synchronize: cudaStreamSynchronize") !=
        std::string::npos);
  // The fault's name: an illegal address (or, where the driver reports the
  // page fault differently, a launch failure).
  CHECK((out.find("cudaErrorIllegalAddress") != std::string::npos ||
         out.find("cudaErrorLaunchFailure") != std::string::npos));
}

TEST_CASE("A full MLP gradient step on CUDA matches the CPU",
          "[cuda_parity][mlp]") {
  std::unique_ptr<Backend> cuda = CudaOrSkip();
  if (cuda == nullptr) return;
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  const std::vector<int> sizes = {784, 256, 128, 10};
  constexpr int kBatch = 64;
  absl::StatusOr<std::unique_ptr<Mlp>> mlp_cpu =
      Mlp::Create(sizes, kBatch, cpu.get());
  absl::StatusOr<std::unique_ptr<Mlp>> mlp_gpu =
      Mlp::Create(sizes, kBatch, cuda.get());
  REQUIRE(mlp_cpu.ok());
  REQUIRE(mlp_gpu.ok());

  std::mt19937_64 rng(17);
  std::vector<std::vector<float>> params;
  std::vector<const float*> param_ptrs;
  for (const ParamInfo& p : (*mlp_cpu)->params()) {
    // He-style uniform init for weights (fan_in = shape[0]); small biases.
    const float r = p.is_bias ? 0.1f : std::sqrt(6.0f / p.shape[0]);
    params.push_back(RandomVector(p.num_elements(), rng, -r, r));
  }
  for (const auto& p : params) param_ptrs.push_back(p.data());
  const std::vector<float> x = RandomVector(size_t(kBatch) * 784, rng, 0, 1);
  std::vector<int32_t> labels(kBatch);
  std::uniform_int_distribution<int32_t> pick(0, 9);
  for (int32_t& l : labels) l = pick(rng);

  std::vector<std::vector<float>> g_cpu, g_gpu;
  std::vector<float*> gp_cpu, gp_gpu;
  for (const auto& p : params) {
    g_cpu.emplace_back(p.size(), 0.0f);
    g_gpu.emplace_back(p.size(), 0.0f);
  }
  for (auto& g : g_cpu) gp_cpu.push_back(g.data());
  for (auto& g : g_gpu) gp_gpu.push_back(g.data());

  absl::StatusOr<SoftmaxXentResult> want = (*mlp_cpu)->ComputeGradients(
      param_ptrs, x.data(), labels.data(), kBatch, gp_cpu);
  absl::StatusOr<SoftmaxXentResult> got = (*mlp_gpu)->ComputeGradients(
      param_ptrs, x.data(), labels.data(), kBatch, gp_gpu);
  REQUIRE(want.ok());
  REQUIRE(got.ok());
  // Tolerance. The logits pass through three GEMMs (k <= 784) whose errors
  // are bounded by k * eps relative to |A||B| (see the Gemm case) but in
  // practice grow like sqrt(k) * eps ~ 3e-6 relative; the loss is smooth in
  // the logits. Gradients go through three more GEMMs and the ReLU masks, so
  // they are compared tensor-wise in relative L2 norm at 1e-4: ~30x the
  // expected rounding noise, far below any real bug (a wrong transpose,
  // bias or mask gives O(1)). Caveat: a pre-activation within ~1e-6 of zero
  // could flip one ReLU mask entry between backends, a ~1e-2 relative change
  // in one tensor; the seed is fixed, so such a case would fail the same way
  // on every run and is recognizable as one tensor barely over.
  CHECK(std::fabs(got->mean_loss - want->mean_loss) <=
        1e-5 * std::max(1.0, std::fabs(want->mean_loss)));
  CHECK(got->correct == want->correct);
  const auto& infos = (*mlp_cpu)->params();
  for (size_t t = 0; t < infos.size(); ++t) {
    double diff2 = 0, ref2 = 0;
    for (size_t i = 0; i < g_cpu[t].size(); ++i) {
      const double d = double(g_gpu[t][i]) - g_cpu[t][i];
      diff2 += d * d;
      ref2 += double(g_cpu[t][i]) * g_cpu[t][i];
    }
    INFO(infos[t].name << ": |g_cuda - g_cpu| = " << std::sqrt(diff2)
                       << ", |g_cpu| = " << std::sqrt(ref2));
    CHECK(ref2 > 0);
    CHECK(std::sqrt(diff2) <= 1e-4 * std::sqrt(ref2));
  }
}

}  // namespace
}  // namespace asyncps

// Probes the device once: with ASYNCPS_REQUIRE_CUDA=1 a missing or unusable
// one fails the run at once; otherwise the cases run (those needing a GPU
// return early without one) and a run without a GPU ends with the
// project's skip line.
int main(int argc, char** argv) {
  asyncps::g_argv0 = argc > 0 ? argv[0] : "";
  if (argc == 2 && std::string(argv[1]) == "--asyncps_fault_child") {
    return asyncps::RunFaultChild();
  }
  std::string unusable;
  {
    absl::StatusOr<std::unique_ptr<asyncps::Backend>> probe =
        asyncps::MakeCudaBackend(0);
    if (!probe.ok()) unusable = std::string(probe.status().message());
  }
  const char* require = std::getenv("ASYNCPS_REQUIRE_CUDA");
  if (!unusable.empty() && require != nullptr && std::string(require) == "1") {
    std::printf(
        "FAILED: ASYNCPS_REQUIRE_CUDA=1 but no usable CUDA device: %s\n",
        unusable.c_str());
    return 1;
  }
  const int rc = Catch::Session().run(argc, argv);
  if (rc == 0 && !unusable.empty()) {
    std::printf(
        "ASYNCPS_SKIPPED: CUDA parity not checked: %s (only the checks that "
        "need no GPU ran)\n",
        unusable.c_str());
  }
  return rc;
}
