#ifndef ASYNCPS_KERNELS_CUDA_KERNELS_H_
#define ASYNCPS_KERNELS_CUDA_KERNELS_H_

// Launchers for the CUDA backend's kernels (kernels/cuda_backend.cu, built by
// nvcc). Private to kernels:cuda_backend; the Backend itself lives in
// kernels/cuda_backend.cc (built by the host compiler), so nvcc never parses
// Abseil.
//
// Every launcher enqueues work on `stream` and returns the launch error
// (cudaGetLastError after the launch); errors raised while the kernel runs
// surface at the next synchronization. Pointers are device pointers unless
// stated otherwise. Launchers are thread-safe in the sense of the CUDA
// runtime: they keep no state of their own.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace asyncps {
namespace cuda_kernels {

// Sums written by LaunchSoftmaxXent, in device memory.
struct XentTotals {
  double loss_sum;    // sum over rows of -log softmax(logits)[label]
  long long correct;  // rows whose (lowest-index) argmax equals the label
};

// cudaSuccess when this binary carries code the current device can run
// (sm_90 SASS or compute_90 PTX); else the error the runtime reports.
cudaError_t CheckKernelImage();

// x[i] = value for i < n.
cudaError_t LaunchFill(float* x, size_t n, float value, cudaStream_t stream);

// x[i] *= beta for i < n (beta == 0 writes exact zeros, as BLAS does).
cudaError_t LaunchScale(float* x, size_t n, float beta, cudaStream_t stream);

// y[r][c] += bias[c]; then max(y, 0) if relu. REQUIRES: rows, cols > 0.
cudaError_t LaunchBiasActivation(float* y, const float* bias, int rows,
                                 int cols, bool relu, cudaStream_t stream);

// dy[i] = y[i] > 0 ? dy[i] : 0 for i < n.
cudaError_t LaunchReluBackward(float* dy, const float* y, size_t n,
                               cudaStream_t stream);

// out[c] = sum over r of x[r][c]; deterministic (fixed reduction order).
// REQUIRES: rows >= 0, cols > 0.
cudaError_t LaunchColumnSum(const float* x, int rows, int cols, float* out,
                            cudaStream_t stream);

// Softmax cross-entropy, one warp per row, max-subtracted log-sum-exp in
// fp32. Writes per-row losses/hits to row_loss/row_correct (rows entries
// each), then reduces them (fp64, fixed order) into *totals. When dlogits is
// not null it receives (softmax - onehot) / rows; dlogits may equal logits.
// REQUIRES: rows, cols > 0; labels (device) each in [0, cols).
cudaError_t LaunchSoftmaxXent(const float* logits, const int32_t* labels,
                              int rows, int cols, float* dlogits,
                              float* row_loss, int32_t* row_correct,
                              XentTotals* totals, cudaStream_t stream);

}  // namespace cuda_kernels
}  // namespace asyncps

#endif  // ASYNCPS_KERNELS_CUDA_KERNELS_H_
