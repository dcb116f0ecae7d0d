#ifndef ASYNCPS_KERNELS_CPU_BACKEND_H_
#define ASYNCPS_KERNELS_CPU_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace asyncps {

// Sets how many threads OpenBLAS may use inside one GEMM, for the whole
// process (OpenBLAS's own default is every core, or OPENBLAS_NUM_THREADS).
// n >= 1. Call before any GEMM runs.
void SetCpuGemmThreads(int n);

// The reference Backend: host memory, OpenBLAS cblas_sgemm for GEMM and plain
// loops (written to auto-vectorize) for everything else. Every operation
// completes before it returns, so Synchronize() is a no-op and the Copy*
// calls are memcpy. The CUDA backend is tested for parity against this one.
//
// Memory from Alloc/AllocHost is 64-byte aligned and must be released with
// Free/FreeHost of this backend (both are std::free underneath). Invalid
// arguments (kernels/backend_checks.h) are INVALID_ARGUMENT, as on CUDA.
//
// Not thread-safe, like every Backend; distinct instances are independent.
// (OpenBLAS may use its own threads inside one Gemm call: SetCpuGemmThreads.)
class CpuBackend final : public Backend {
 public:
  CpuBackend() = default;

  std::string name() const override { return "cpu"; }

  // RESOURCE_EXHAUSTED when the allocation fails.
  absl::StatusOr<float*> Alloc(size_t n) override;
  absl::Status Free(float* p) override;
  absl::StatusOr<float*> AllocHost(size_t n) override;
  absl::Status FreeHost(float* p) override;

  absl::Status CopyToDevice(float* dst, const float* src, size_t n) override;
  absl::Status CopyToHost(float* dst, const float* src, size_t n) override;
  absl::Status Fill(float* x, size_t n, float value) override;

  absl::Status Gemm(bool trans_a, bool trans_b, int m, int n, int k,
                    float alpha, const float* a, const float* b, float beta,
                    float* c) override;
  absl::Status BiasActivation(float* y, const float* bias, int rows, int cols,
                              bool relu) override;
  absl::Status ReluBackward(float* dy, const float* y, size_t n) override;
  absl::Status ColumnSum(const float* x, int rows, int cols,
                         float* out) override;

  // Per row: max-subtracted log-sum-exp in double; the loss is accumulated
  // in double over rows. Ties in argmax go to the lowest index. Labels are
  // checked before anything is written.
  absl::StatusOr<SoftmaxXentResult> SoftmaxCrossEntropy(
      const float* logits, const int32_t* labels, int rows, int cols,
      float* dlogits) override;

  absl::Status Synchronize() override { return absl::OkStatus(); }
};

}  // namespace asyncps

#endif  // ASYNCPS_KERNELS_CPU_BACKEND_H_
