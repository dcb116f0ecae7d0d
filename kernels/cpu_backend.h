#ifndef ASYNCPS_KERNELS_CPU_BACKEND_H_
#define ASYNCPS_KERNELS_CPU_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/backend.h"

namespace asyncps {

// The reference Backend: host memory, OpenBLAS cblas_sgemm for GEMM and plain
// loops (written to auto-vectorize) for everything else. Every operation
// completes before it returns, so Synchronize() is a no-op and the Copy*
// calls are memcpy. The CUDA backend is tested for parity against this one.
//
// Memory from Alloc/AllocHost is 64-byte aligned and must be released with
// Free/FreeHost of this backend (both are std::free underneath).
//
// Not thread-safe, like every Backend; distinct instances are independent.
// (OpenBLAS may use its own threads inside one Gemm call.)
class CpuBackend final : public Backend {
 public:
  CpuBackend() = default;

  std::string name() const override { return "cpu"; }

  // Returns nullptr only when n == 0 or the allocation fails.
  float* Alloc(size_t n) override;
  void Free(float* p) override;
  float* AllocHost(size_t n) override;
  void FreeHost(float* p) override;

  void CopyToDevice(float* dst, const float* src, size_t n) override;
  void CopyToHost(float* dst, const float* src, size_t n) override;
  void Fill(float* x, size_t n, float value) override;

  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
            const float* a, const float* b, float beta, float* c) override;
  void BiasActivation(float* y, const float* bias, int rows, int cols,
                      bool relu) override;
  void ReluBackward(float* dy, const float* y, size_t n) override;
  void ColumnSum(const float* x, int rows, int cols, float* out) override;

  // Per row: max-subtracted log-sum-exp in double; the loss is accumulated
  // in double over rows. Ties in argmax go to the lowest index.
  // REQUIRES: labels[r] in [0, cols) (the caller validates; an out-of-range
  // label is a programmer error and aborts the process).
  SoftmaxXentResult SoftmaxCrossEntropy(const float* logits,
                                        const int32_t* labels, int rows,
                                        int cols, float* dlogits) override;

  void Synchronize() override {}
};

}  // namespace asyncps

#endif  // ASYNCPS_KERNELS_CPU_BACKEND_H_
