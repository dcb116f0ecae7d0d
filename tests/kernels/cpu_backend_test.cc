// Spec for the CPU backend: every op against a naive double-precision
// reference, and MakeBackend's name handling.

#include "kernels/cpu_backend.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "tests/testing/require_ok.h"

namespace asyncps {
namespace {

std::vector<float> RandomVector(size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Naive reference: C = alpha * op(A) op(B) + beta * C in double.
std::vector<float> NaiveGemm(bool ta, bool tb, int m, int n, int k, float alpha,
                             const std::vector<float>& a,
                             const std::vector<float>& b, float beta,
                             std::vector<float> c) {
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int p = 0; p < k; ++p) {
        const double av = ta ? a[p * m + i] : a[i * k + p];
        const double bv = tb ? b[j * k + p] : b[p * n + j];
        s += av * bv;
      }
      c[i * n + j] = static_cast<float>(alpha * s + beta * c[i * n + j]);
    }
  }
  return c;
}

// SoftmaxCrossEntropy that must succeed.
SoftmaxXentResult Xent(CpuBackend& be, const float* logits,
                       const int32_t* labels, int rows, int cols,
                       float* dlogits) {
  absl::StatusOr<SoftmaxXentResult> r =
      be.SoftmaxCrossEntropy(logits, labels, rows, cols, dlogits);
  REQUIRE_OK(r.status());
  return *r;
}

TEST_CASE("Alloc and AllocHost return 64-byte aligned memory",
          "[cpu_backend]") {
  CpuBackend be;
  for (size_t n : {1, 3, 17, 1000}) {
    absl::StatusOr<float*> d = be.Alloc(n);
    absl::StatusOr<float*> h = be.AllocHost(n);
    REQUIRE_OK(d.status());
    REQUIRE_OK(h.status());
    REQUIRE(*d != nullptr);
    REQUIRE(*h != nullptr);
    CHECK(reinterpret_cast<uintptr_t>(*d) % 64 == 0);
    CHECK(reinterpret_cast<uintptr_t>(*h) % 64 == 0);
    REQUIRE_OK(be.Fill(*d, n, 2.5f));
    REQUIRE_OK(be.CopyToHost(*h, *d, n));
    for (size_t i = 0; i < n; ++i) CHECK(h.value()[i] == 2.5f);
    REQUIRE_OK(be.Free(*d));
    REQUIRE_OK(be.FreeHost(*h));
  }
  REQUIRE_OK(be.Free(nullptr));
  REQUIRE_OK(be.FreeHost(nullptr));
  absl::StatusOr<float*> none = be.Alloc(0);
  REQUIRE_OK(none.status());
  CHECK(*none == nullptr);
  CHECK(be.name() == "cpu");
}

TEST_CASE("DeviceBuffer round-trips data through the backend",
          "[cpu_backend]") {
  CpuBackend be;
  std::mt19937_64 rng(1);
  std::vector<float> src = RandomVector(37, rng);
  absl::StatusOr<DeviceBuffer> buf = DeviceBuffer::Make(&be, src.size());
  REQUIRE_OK(buf.status());
  CHECK(buf->size() == src.size());
  REQUIRE_OK(be.CopyToDevice(buf->data(), src.data(), src.size()));
  REQUIRE_OK(be.Synchronize());
  std::vector<float> back(src.size());
  REQUIRE_OK(be.CopyToHost(back.data(), buf->data(), back.size()));
  CHECK(back == src);

  // Moving transfers ownership; an empty buffer holds nothing.
  DeviceBuffer moved = *std::move(buf);
  CHECK(moved.size() == src.size());
  absl::StatusOr<DeviceBuffer> empty = DeviceBuffer::Make(&be, 0);
  REQUIRE_OK(empty.status());
  CHECK(empty->data() == nullptr);
}

TEST_CASE("Gemm matches a naive reference for all transpose combinations",
          "[cpu_backend][gemm]") {
  CpuBackend be;
  std::mt19937_64 rng(42);
  struct Shape {
    int m, n, k;
  };
  const Shape shapes[] = {{1, 1, 1},   {3, 5, 7},    {17, 1, 9},
                          {1, 13, 31}, {33, 65, 17}, {64, 10, 784}};
  const float alphas[] = {1.0f, -0.5f};
  const float betas[] = {0.0f, 1.0f, 0.25f};
  for (const Shape& s : shapes) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      for (float alpha : alphas) {
        for (float beta : betas) {
          std::vector<float> a = RandomVector(size_t(s.m) * s.k, rng);
          std::vector<float> b = RandomVector(size_t(s.k) * s.n, rng);
          std::vector<float> c = RandomVector(size_t(s.m) * s.n, rng);
          std::vector<float> want =
              NaiveGemm(ta, tb, s.m, s.n, s.k, alpha, a, b, beta, c);
          REQUIRE_OK(be.Gemm(ta, tb, s.m, s.n, s.k, alpha, a.data(), b.data(),
                             beta, c.data()));
          INFO("m=" << s.m << " n=" << s.n << " k=" << s.k << " ta=" << ta
                    << " tb=" << tb << " alpha=" << alpha << " beta=" << beta);
          // Float accumulation over k terms of magnitude <= 1.
          const double tol = 1e-5 * (s.k + 1);
          for (size_t i = 0; i < c.size(); ++i) {
            REQUIRE(std::fabs(c[i] - want[i]) <= tol);
          }
        }
      }
    }
  }
}

TEST_CASE("Gemm with k == 0 scales C by beta", "[cpu_backend][gemm]") {
  CpuBackend be;
  std::vector<float> c = {1, 2, 3, 4, 5, 6};
  REQUIRE_OK(
      be.Gemm(false, false, 2, 3, 0, 1.0f, nullptr, nullptr, 0.5f, c.data()));
  CHECK(c == std::vector<float>{0.5f, 1, 1.5f, 2, 2.5f, 3});
}

TEST_CASE("BiasActivation adds the bias per column and applies ReLU",
          "[cpu_backend]") {
  CpuBackend be;
  std::mt19937_64 rng(7);
  for (bool relu : {false, true}) {
    const int rows = 5, cols = 13;
    std::vector<float> y = RandomVector(rows * cols, rng);
    std::vector<float> bias = RandomVector(cols, rng);
    std::vector<float> want(y.size());
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) {
        float v = y[r * cols + c] + bias[c];
        want[r * cols + c] = relu ? std::max(v, 0.0f) : v;
      }
    }
    REQUIRE_OK(be.BiasActivation(y.data(), bias.data(), rows, cols, relu));
    CHECK(y == want);
  }
}

TEST_CASE("ReluBackward zeroes gradients where the output is not positive",
          "[cpu_backend]") {
  CpuBackend be;
  std::vector<float> y = {0.0f, 1.0f, 0.0f, 3.0f, 2.0f, 0.0f, 0.5f};
  std::vector<float> dy = {1, 2, 3, 4, 5, 6, 7};
  REQUIRE_OK(be.ReluBackward(dy.data(), y.data(), dy.size()));
  CHECK(dy == std::vector<float>{0, 2, 0, 4, 5, 0, 7});
}

TEST_CASE("ColumnSum sums every column over the rows", "[cpu_backend]") {
  CpuBackend be;
  std::mt19937_64 rng(9);
  const int rows = 31, cols = 7;
  std::vector<float> x = RandomVector(rows * cols, rng);
  std::vector<float> out(cols, 123.0f);  // overwritten, not accumulated
  REQUIRE_OK(be.ColumnSum(x.data(), rows, cols, out.data()));
  for (int c = 0; c < cols; ++c) {
    double s = 0;
    for (int r = 0; r < rows; ++r) s += x[r * cols + c];
    CHECK(out[c] == Approx(s).margin(1e-5));
  }
}

TEST_CASE("SoftmaxCrossEntropy matches a hand-computed example",
          "[cpu_backend][xent]") {
  CpuBackend be;
  // Row 0: logits (0, ln 2, ln 3) -> softmax (1/6, 2/6, 3/6), label 2.
  // Row 1: logits (0, 0, 0) -> softmax (1/3, 1/3, 1/3), label 0.
  const float l2 = std::log(2.0f), l3 = std::log(3.0f);
  std::vector<float> logits = {0.0f, l2, l3, 0.0f, 0.0f, 0.0f};
  std::vector<int32_t> labels = {2, 0};
  std::vector<float> d(6);
  const SoftmaxXentResult res =
      Xent(be, logits.data(), labels.data(), 2, 3, d.data());
  const double want_loss =
      (std::log(2.0) + std::log(3.0)) / 2;  // (ln 2 + ln 3)/2
  CHECK(res.mean_loss == Approx(want_loss).epsilon(1e-6));
  // Row 0 argmax 2 == label; row 1 ties go to index 0 == label.
  CHECK(res.correct == 2);
  const double want_d[] = {1.0 / 6 / 2,       2.0 / 6 / 2, (3.0 / 6 - 1) / 2,
                           (1.0 / 3 - 1) / 2, 1.0 / 3 / 2, 1.0 / 3 / 2};
  for (int i = 0; i < 6; ++i) CHECK(d[i] == Approx(want_d[i]).margin(1e-6));

  // Without dlogits only the loss and the count are computed.
  const SoftmaxXentResult res2 =
      Xent(be, logits.data(), labels.data(), 2, 3, nullptr);
  CHECK(res2.mean_loss == res.mean_loss);
  CHECK(res2.correct == res.correct);
}

TEST_CASE("SoftmaxCrossEntropy is stable for huge logits",
          "[cpu_backend][xent]") {
  CpuBackend be;
  // exp(1e4) overflows float and double; the max-subtracted form does not.
  std::vector<float> logits = {1e4f, 0.0f, -1e4f, 1e4f, 1e4f - 1.0f, 0.0f};
  std::vector<int32_t> labels = {1, 1};
  std::vector<float> d(6);
  const SoftmaxXentResult res =
      Xent(be, logits.data(), labels.data(), 2, 3, d.data());
  REQUIRE(std::isfinite(res.mean_loss));
  // Row 0: loss = 1e4 (label logit 1e4 below the max, others vanish).
  // Row 1: logits (1e4, 1e4 - 1, 0), label 1:
  //   loss = log(1 + e^-1 + e^-1e4) - (-1) ~= log(1 + e^-1) + 1.
  const double row1 = std::log(1.0 + std::exp(-1.0)) + 1.0;
  CHECK(res.mean_loss == Approx((1e4 + row1) / 2).epsilon(1e-6));
  CHECK(res.correct == 0);
  for (float v : d) CHECK(std::isfinite(v));
  CHECK(d[0] == Approx(0.5).margin(1e-6));
  CHECK(d[1] == Approx(-0.5).margin(1e-6));
  const double p0 = 1.0 / (1.0 + std::exp(-1.0));
  CHECK(d[3] == Approx(p0 / 2).margin(1e-6));
  CHECK(d[4] == Approx((1 - p0 - 1) / 2).margin(1e-6));
}

TEST_CASE("SoftmaxCrossEntropy matches a reference on random inputs",
          "[cpu_backend][xent]") {
  CpuBackend be;
  std::mt19937_64 rng(11);
  const int rows = 9, cols = 10;
  std::vector<float> logits = RandomVector(rows * cols, rng);
  for (float& v : logits) v *= 5;
  std::vector<int32_t> labels(rows);
  for (int r = 0; r < rows; ++r) labels[r] = static_cast<int32_t>(rng() % cols);
  std::vector<float> d(rows * cols);
  const SoftmaxXentResult res =
      Xent(be, logits.data(), labels.data(), rows, cols, d.data());
  double loss = 0;
  int64_t correct = 0;
  for (int r = 0; r < rows; ++r) {
    const float* z = &logits[r * cols];
    double sum = 0;
    int best = 0;
    for (int c = 0; c < cols; ++c) {
      sum += std::exp(double(z[c]));
      if (z[c] > z[best]) best = c;
    }
    loss += std::log(sum) - z[labels[r]];
    correct += best == labels[r];
    for (int c = 0; c < cols; ++c) {
      const double p = std::exp(double(z[c])) / sum;
      const double want = (p - (c == labels[r] ? 1 : 0)) / rows;
      CHECK(d[r * cols + c] == Approx(want).margin(1e-6));
    }
  }
  CHECK(res.mean_loss == Approx(loss / rows).epsilon(1e-6));
  CHECK(res.correct == correct);
}

// REQUIRES that `s` is INVALID_ARGUMENT and its message holds every part.
void CheckInvalid(const absl::Status& s,
                  const std::vector<std::string>& parts) {
  INFO(s.ToString());
  CHECK(absl::IsInvalidArgument(s));
  for (const std::string& part : parts) {
    CHECK(s.message().find(part) != absl::string_view::npos);
  }
}

TEST_CASE("bad arguments are INVALID_ARGUMENT naming the operation",
          "[cpu_backend][errors]") {
  CpuBackend be;
  std::vector<float> a(12, 1.0f), b(12, 1.0f), c(12, 5.0f);
  const std::vector<float> c0 = c;
  CheckInvalid(
      be.Gemm(false, false, -1, 3, 4, 1.0f, a.data(), b.data(), 0.0f, c.data()),
      {"Gemm", "negative size", "m=-1"});
  CheckInvalid(
      be.Gemm(false, false, 3, 4, 2, 1.0f, nullptr, b.data(), 0.0f, c.data()),
      {"Gemm", "A is a null pointer"});
  CheckInvalid(
      be.Gemm(true, true, 3, 4, 2, 1.0f, a.data(), b.data(), 0.0f, nullptr),
      {"Gemm", "C is a null pointer"});
  CheckInvalid(be.BiasActivation(c.data(), b.data(), 3, -4, true),
               {"BiasActivation", "cols=-4"});
  CheckInvalid(be.BiasActivation(c.data(), nullptr, 3, 4, true),
               {"BiasActivation", "bias"});
  CheckInvalid(be.ReluBackward(c.data(), nullptr, 12), {"ReluBackward", "y"});
  CheckInvalid(be.ColumnSum(a.data(), -2, 6, c.data()),
               {"ColumnSum", "rows=-2"});
  CheckInvalid(be.ColumnSum(a.data(), 2, 6, nullptr), {"ColumnSum", "out"});
  CheckInvalid(be.Fill(nullptr, 3, 1.0f), {"Fill"});
  CheckInvalid(be.CopyToDevice(c.data(), nullptr, 12), {"CopyToDevice", "src"});
  CheckInvalid(be.CopyToHost(nullptr, a.data(), 12), {"CopyToHost", "dst"});
  // Nothing was written by any of the rejected calls.
  CHECK(c == c0);

  // Empty operations accept null pointers and do nothing.
  REQUIRE_OK(
      be.Gemm(false, false, 0, 3, 4, 1.0f, nullptr, nullptr, 0.0f, nullptr));
  REQUIRE_OK(be.BiasActivation(nullptr, nullptr, 0, 4, true));
  REQUIRE_OK(be.ReluBackward(nullptr, nullptr, 0));
  REQUIRE_OK(be.ColumnSum(nullptr, 3, 0, nullptr));
  REQUIRE_OK(be.Fill(nullptr, 0, 1.0f));
  REQUIRE_OK(be.CopyToDevice(nullptr, nullptr, 0));
}

TEST_CASE("SoftmaxCrossEntropy rejects out-of-range labels before writing",
          "[cpu_backend][errors][xent]") {
  CpuBackend be;
  std::vector<float> logits(3 * 4, 0.5f);
  std::vector<float> d(logits.size(), 7.0f);
  for (int32_t bad : {-1, 4}) {
    std::vector<int32_t> labels = {0, bad, 2};
    absl::StatusOr<SoftmaxXentResult> r =
        be.SoftmaxCrossEntropy(logits.data(), labels.data(), 3, 4, d.data());
    CheckInvalid(r.status(),
                 {"SoftmaxCrossEntropy",
                  "label " + std::to_string(bad) + " of row 1", "[0, 4)"});
    // Row 0 is valid, but nothing is written before every label is checked.
    CHECK(d == std::vector<float>(logits.size(), 7.0f));
  }
  std::vector<int32_t> labels = {0, 1, 2};
  CheckInvalid(
      be.SoftmaxCrossEntropy(logits.data(), labels.data(), -3, 4, nullptr)
          .status(),
      {"SoftmaxCrossEntropy", "rows=-3"});
  CheckInvalid(
      be.SoftmaxCrossEntropy(nullptr, labels.data(), 3, 4, nullptr).status(),
      {"SoftmaxCrossEntropy", "logits"});
  // Zero rows: a zero result, no error.
  const SoftmaxXentResult zero = Xent(be, nullptr, nullptr, 0, 4, nullptr);
  CHECK(zero.mean_loss == 0);
  CHECK(zero.correct == 0);
}

TEST_CASE("a failed allocation is RESOURCE_EXHAUSTED, not a null pointer",
          "[cpu_backend][errors]") {
  CpuBackend be;
  // 2^60 floats (4 EiB) exceed any address space; SIZE_MAX floats overflow
  // the byte count.
  for (size_t n : {size_t{1} << 60, SIZE_MAX}) {
    INFO("n=" << n);
    absl::StatusOr<float*> d = be.Alloc(n);
    CHECK(absl::IsResourceExhausted(d.status()));
    CHECK(d.status().message().find("Alloc(") != absl::string_view::npos);
    absl::StatusOr<float*> h = be.AllocHost(n);
    CHECK(absl::IsResourceExhausted(h.status()));
    CHECK(h.status().message().find("AllocHost(") != absl::string_view::npos);
    absl::StatusOr<HostBuffer> buf = HostBuffer::Make(&be, n);
    CHECK(absl::IsResourceExhausted(buf.status()));
  }
  CHECK(absl::IsInvalidArgument(DeviceBuffer::Make(nullptr, 4).status()));
}

TEST_CASE("MakeBackend resolves names", "[backend_factory]") {
  auto cpu = MakeBackend("cpu");
  REQUIRE(cpu.ok());
  CHECK((*cpu)->name() == "cpu");

  auto bogus = MakeBackend("bogus");
  REQUIRE(absl::IsInvalidArgument(bogus.status()));
  CHECK(bogus.status().message().find("bogus") != absl::string_view::npos);

  // This build has no CUDA (the default, without --config=cuda).
  auto cuda = MakeBackend("cuda");
  CHECK(absl::IsUnavailable(cuda.status()));

  auto autob = MakeBackend("auto");
  REQUIRE(autob.ok());
  CHECK((*autob)->name() == "cpu");
}

}  // namespace
}  // namespace asyncps
