#include "kernels/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "kernels/backend_checks.h"

// OpenBLAS's own call (not part of CBLAS; its cblas.h declares it too).
extern "C" void openblas_set_num_threads(int num_threads);

namespace asyncps {

void SetCpuGemmThreads(int n) { openblas_set_num_threads(n); }

namespace {

constexpr size_t kAlignment = 64;

// 64-byte aligned, uninitialized; nullptr for n == 0.
absl::StatusOr<float*> AlignedFloats(const char* op, size_t n) {
  if (n == 0) return nullptr;
  absl::Status s = backend_checks::AllocSize(op, n);
  if (!s.ok()) return s;
  // std::aligned_alloc requires the size to be a multiple of the alignment.
  size_t bytes = n * sizeof(float);
  if (bytes > SIZE_MAX - kAlignment) {
    return absl::ResourceExhaustedError(
        absl::StrCat(op, "(", n, " floats): larger than the address space"));
  }
  bytes = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, bytes);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat(op, "(", n, " floats): out of host memory (", bytes,
                     " bytes requested)"));
  }
  return static_cast<float*>(p);
}

}  // namespace

absl::StatusOr<float*> CpuBackend::Alloc(size_t n) {
  return AlignedFloats("Alloc", n);
}

absl::Status CpuBackend::Free(float* p) {
  std::free(p);
  return absl::OkStatus();
}

absl::StatusOr<float*> CpuBackend::AllocHost(size_t n) {
  return AlignedFloats("AllocHost", n);
}

absl::Status CpuBackend::FreeHost(float* p) {
  std::free(p);
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyToDevice(float* dst, const float* src, size_t n) {
  absl::Status s = backend_checks::Copy("CopyToDevice", dst, src, n);
  if (s.ok() && n > 0) std::memcpy(dst, src, n * sizeof(float));
  return s;
}

absl::Status CpuBackend::CopyToHost(float* dst, const float* src, size_t n) {
  absl::Status s = backend_checks::Copy("CopyToHost", dst, src, n);
  if (s.ok() && n > 0) std::memcpy(dst, src, n * sizeof(float));
  return s;
}

absl::Status CpuBackend::Fill(float* x, size_t n, float value) {
  absl::Status s = backend_checks::Fill(x, n);
  if (s.ok()) std::fill(x, x + n, value);
  return s;
}

absl::Status CpuBackend::Gemm(bool trans_a, bool trans_b, int m, int n, int k,
                              float alpha, const float* a, const float* b,
                              float beta, float* c) {
  absl::Status s = backend_checks::Gemm(m, n, k, a, b, c);
  if (!s.ok() || m == 0 || n == 0) return s;
  if (k == 0) {
    // BLAS leaves C = beta * C here too, but some implementations reject
    // lda = 0; handle it directly.
    const size_t total = static_cast<size_t>(m) * n;
    for (size_t i = 0; i < total; ++i) c[i] = beta == 0.0f ? 0.0f : beta * c[i];
    return s;
  }
  // Row-major leading dimensions are the stored row lengths.
  const int lda = trans_a ? m : k;
  const int ldb = trans_b ? k : n;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b,
              ldb, beta, c, n);
  return s;
}

absl::Status CpuBackend::BiasActivation(float* y, const float* bias, int rows,
                                        int cols, bool relu) {
  absl::Status s = backend_checks::BiasActivation(y, bias, rows, cols);
  if (!s.ok()) return s;
  for (int r = 0; r < rows; ++r) {
    float* row = y + static_cast<size_t>(r) * cols;
    if (relu) {
      for (int c = 0; c < cols; ++c) row[c] = std::max(row[c] + bias[c], 0.0f);
    } else {
      for (int c = 0; c < cols; ++c) row[c] += bias[c];
    }
  }
  return s;
}

absl::Status CpuBackend::ReluBackward(float* dy, const float* y, size_t n) {
  absl::Status s = backend_checks::ReluBackward(dy, y, n);
  if (!s.ok()) return s;
  for (size_t i = 0; i < n; ++i) dy[i] = y[i] > 0.0f ? dy[i] : 0.0f;
  return s;
}

absl::Status CpuBackend::ColumnSum(const float* x, int rows, int cols,
                                   float* out) {
  absl::Status s = backend_checks::ColumnSum(x, rows, cols, out);
  if (!s.ok()) return s;
  std::fill(out, out + cols, 0.0f);
  for (int r = 0; r < rows; ++r) {
    const float* row = x + static_cast<size_t>(r) * cols;
    for (int c = 0; c < cols; ++c) out[c] += row[c];
  }
  return s;
}

absl::StatusOr<SoftmaxXentResult> CpuBackend::SoftmaxCrossEntropy(
    const float* logits, const int32_t* labels, int rows, int cols,
    float* dlogits) {
  absl::Status s =
      backend_checks::SoftmaxCrossEntropy(logits, labels, rows, cols);
  if (!s.ok()) return s;
  SoftmaxXentResult result;
  if (rows == 0 || cols == 0) return result;
  double loss_sum = 0.0;
  const double inv_rows = 1.0 / rows;
  for (int r = 0; r < rows; ++r) {
    const float* z = logits + static_cast<size_t>(r) * cols;
    const int32_t label = labels[r];
    int argmax = 0;
    for (int c = 1; c < cols; ++c) {
      if (z[c] > z[argmax]) argmax = c;
    }
    const double zmax = z[argmax];
    double sum = 0.0;
    for (int c = 0; c < cols; ++c) sum += std::exp(z[c] - zmax);
    const double log_sum = std::log(sum);
    // -log softmax(z)[label] = log sum exp(z - zmax) - (z[label] - zmax).
    loss_sum += log_sum - (static_cast<double>(z[label]) - zmax);
    if (argmax == label) ++result.correct;
    if (dlogits != nullptr) {
      float* d = dlogits + static_cast<size_t>(r) * cols;
      for (int c = 0; c < cols; ++c) {
        const double p = std::exp(z[c] - zmax - log_sum);
        d[c] = static_cast<float>(((c == label ? p - 1.0 : p)) * inv_rows);
      }
    }
  }
  result.mean_loss = loss_sum / rows;
  return result;
}

std::unique_ptr<Backend> MakeCpuBackend() {
  return std::make_unique<CpuBackend>();
}

}  // namespace asyncps
