#include "kernels/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace asyncps {
namespace {

constexpr size_t kAlignment = 64;

// 64-byte aligned, uninitialized; nullptr for n == 0 or on failure.
float* AlignedFloats(size_t n) {
  if (n == 0) return nullptr;
  if (n > (SIZE_MAX - kAlignment) / sizeof(float)) return nullptr;
  // std::aligned_alloc requires the size to be a multiple of the alignment.
  size_t bytes = n * sizeof(float);
  bytes = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  return static_cast<float*>(std::aligned_alloc(kAlignment, bytes));
}

}  // namespace

float* CpuBackend::Alloc(size_t n) { return AlignedFloats(n); }
void CpuBackend::Free(float* p) { std::free(p); }
float* CpuBackend::AllocHost(size_t n) { return AlignedFloats(n); }
void CpuBackend::FreeHost(float* p) { std::free(p); }

void CpuBackend::CopyToDevice(float* dst, const float* src, size_t n) {
  if (n > 0) std::memcpy(dst, src, n * sizeof(float));
}

void CpuBackend::CopyToHost(float* dst, const float* src, size_t n) {
  if (n > 0) std::memcpy(dst, src, n * sizeof(float));
}

void CpuBackend::Fill(float* x, size_t n, float value) {
  std::fill(x, x + n, value);
}

void CpuBackend::Gemm(bool trans_a, bool trans_b, int m, int n, int k,
                      float alpha, const float* a, const float* b, float beta,
                      float* c) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    // BLAS leaves C = beta * C here too, but some implementations reject
    // lda = 0; handle it directly.
    const size_t total = static_cast<size_t>(m) * n;
    for (size_t i = 0; i < total; ++i) c[i] = beta == 0.0f ? 0.0f : beta * c[i];
    return;
  }
  // Row-major leading dimensions are the stored row lengths.
  const int lda = trans_a ? m : k;
  const int ldb = trans_b ? k : n;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b,
              ldb, beta, c, n);
}

void CpuBackend::BiasActivation(float* y, const float* bias, int rows, int cols,
                                bool relu) {
  for (int r = 0; r < rows; ++r) {
    float* row = y + static_cast<size_t>(r) * cols;
    if (relu) {
      for (int c = 0; c < cols; ++c) row[c] = std::max(row[c] + bias[c], 0.0f);
    } else {
      for (int c = 0; c < cols; ++c) row[c] += bias[c];
    }
  }
}

void CpuBackend::ReluBackward(float* dy, const float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) dy[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

void CpuBackend::ColumnSum(const float* x, int rows, int cols, float* out) {
  std::fill(out, out + cols, 0.0f);
  for (int r = 0; r < rows; ++r) {
    const float* row = x + static_cast<size_t>(r) * cols;
    for (int c = 0; c < cols; ++c) out[c] += row[c];
  }
}

SoftmaxXentResult CpuBackend::SoftmaxCrossEntropy(const float* logits,
                                                  const int32_t* labels,
                                                  int rows, int cols,
                                                  float* dlogits) {
  SoftmaxXentResult result;
  if (rows <= 0 || cols <= 0) return result;
  double loss_sum = 0.0;
  const double inv_rows = 1.0 / rows;
  for (int r = 0; r < rows; ++r) {
    const float* z = logits + static_cast<size_t>(r) * cols;
    const int32_t label = labels[r];
    if (label < 0 || label >= cols) {
      std::fprintf(stderr,
                   "CpuBackend::SoftmaxCrossEntropy: label %d of row %d is "
                   "outside [0, %d)\n",
                   label, r, cols);
      std::abort();
    }
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
