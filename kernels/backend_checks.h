#ifndef ASYNCPS_KERNELS_BACKEND_CHECKS_H_
#define ASYNCPS_KERNELS_BACKEND_CHECKS_H_

// Argument checks shared by every Backend implementation, so that the CPU
// and CUDA backends accept and reject exactly the same calls (the contracts
// of kernels/backend.h). Each returns OK or INVALID_ARGUMENT with a message
// that starts with the operation's name. Null pointers are accepted where
// the sizes make the operation touch no memory through them.
//
// Private to kernels/. Thread-safe (pure functions).

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace asyncps {
namespace backend_checks {

// n floats must be addressable in bytes; `op` is e.g. "Alloc".
absl::Status AllocSize(const char* op, size_t n);
// CopyToDevice / CopyToHost.
absl::Status Copy(const char* op, const float* dst, const float* src, size_t n);
absl::Status Fill(const float* x, size_t n);
absl::Status Gemm(int m, int n, int k, const float* a, const float* b,
                  const float* c);
absl::Status BiasActivation(const float* y, const float* bias, int rows,
                            int cols);
absl::Status ReluBackward(const float* dy, const float* y, size_t n);
absl::Status ColumnSum(const float* x, int rows, int cols, const float* out);
// Also checks every label is in [0, cols) (labels are host memory).
absl::Status SoftmaxCrossEntropy(const float* logits, const int32_t* labels,
                                 int rows, int cols);

}  // namespace backend_checks
}  // namespace asyncps

#endif  // ASYNCPS_KERNELS_BACKEND_CHECKS_H_
