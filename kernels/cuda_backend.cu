// Device kernels of the CUDA backend (see kernels/cuda_kernels.h for the
// contracts). GEMM is cuBLAS and lives in kernels/cuda_backend.cc; these are
// the memory-bound element-wise and reduction kernels around it.
//
// Built by nvcc for sm_90 SASS plus compute_90 PTX (see kernels/BUILD).
// No fast-math: expf/logf are the accurate versions so CPU parity holds.

#include <cuda_runtime.h>

#include <cfloat>
#include <climits>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda_kernels.h"

namespace asyncps {
namespace cuda_kernels {
namespace {

constexpr int kThreads = 256;
// Grid-stride kernels need no more blocks than can be resident at once; 132
// SMs x 8 blocks of 256 threads covers an H100/H200 and leaves slack.
constexpr size_t kMaxBlocks = 4096;

unsigned int BlocksFor(size_t n) {
  size_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  if (blocks == 0) blocks = 1;
  return static_cast<unsigned int>(blocks);
}

__global__ void FillKernel(float* x, size_t n, float value) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
       i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    x[i] = value;
  }
}

__global__ void ScaleKernel(float* x, size_t n, float beta) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
       i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    x[i] = beta == 0.0f ? 0.0f : beta * x[i];
  }
}

template <bool kRelu>
__global__ void BiasActivationKernel(float* __restrict__ y,
                                     const float* __restrict__ bias, size_t n,
                                     int cols) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
       i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float v = y[i] + __ldg(bias + i % cols);
    y[i] = kRelu ? fmaxf(v, 0.0f) : v;
  }
}

__global__ void ReluBackwardKernel(float* __restrict__ dy,
                                   const float* __restrict__ y, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
       i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    if (!(y[i] > 0.0f)) dy[i] = 0.0f;
  }
}

// Block (32, kColSumRows): threadIdx.x picks a column (coalesced across the
// warp), threadIdx.y strides over rows; partial sums meet in shared memory.
constexpr int kColSumRows = 16;

__global__ void ColumnSumKernel(const float* __restrict__ x, int rows, int cols,
                                float* __restrict__ out) {
  __shared__ float partial[kColSumRows][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  float sum = 0.0f;
  if (c < cols) {
    for (int r = threadIdx.y; r < rows; r += kColSumRows) {
      sum += x[static_cast<size_t>(r) * cols + c];
    }
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = 0.0f;
    for (int j = 0; j < kColSumRows; ++j) total += partial[j][threadIdx.x];
    out[c] = total;
  }
}

constexpr int kXentWarpsPerBlock = 4;
constexpr unsigned kFullMask = 0xffffffffu;

// One warp per row. Three passes over the row (it stays in L1/L2): max and
// lowest-index argmax, sum of exp(z - max), then the gradient.
__global__ void SoftmaxXentRowsKernel(const float* logits,
                                      const int32_t* __restrict__ labels,
                                      int rows, int cols, float* dlogits,
                                      float* __restrict__ row_loss,
                                      int32_t* __restrict__ row_correct) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kXentWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;  // uniform across the warp
  const float* z = logits + static_cast<size_t>(row) * cols;
  const int label = labels[row];

  float zmax = -INFINITY;
  int argmax = INT_MAX;
  for (int c = lane; c < cols; c += 32) {
    const float v = z[c];
    if (v > zmax) {  // columns rise per lane: strict > keeps the lowest index
      zmax = v;
      argmax = c;
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other_max = __shfl_xor_sync(kFullMask, zmax, offset);
    const int other_arg = __shfl_xor_sync(kFullMask, argmax, offset);
    if (other_max > zmax || (other_max == zmax && other_arg < argmax)) {
      zmax = other_max;
      argmax = other_arg;
    }
  }
  // Read before any lane writes dlogits (which may alias logits); the
  // shuffles below order every lane's read before the writes of pass 3.
  const float z_label = z[label];

  float sum = 0.0f;
  for (int c = lane; c < cols; c += 32) sum += expf(z[c] - zmax);
  for (int offset = 16; offset > 0; offset >>= 1) {
    sum += __shfl_xor_sync(kFullMask, sum, offset);
  }
  const float log_sum = logf(sum);

  if (lane == 0) {
    // -log softmax(z)[label] = log sum exp(z - zmax) - (z[label] - zmax).
    row_loss[row] = log_sum - (z_label - zmax);
    row_correct[row] = argmax == label ? 1 : 0;
  }
  if (dlogits != nullptr) {
    const float inv_rows = 1.0f / static_cast<float>(rows);
    float* d = dlogits + static_cast<size_t>(row) * cols;
    for (int c = lane; c < cols; c += 32) {
      const float p = expf(z[c] - zmax - log_sum);
      d[c] = (c == label ? p - 1.0f : p) * inv_rows;
    }
  }
}

constexpr int kReduceThreads = 1024;

// One block: fixed-order (deterministic) fp64 reduction of the per-row
// results into *totals.
__global__ void XentReduceKernel(const float* __restrict__ row_loss,
                                 const int32_t* __restrict__ row_correct,
                                 int rows, XentTotals* __restrict__ totals) {
  __shared__ double loss[kReduceThreads];
  __shared__ long long correct[kReduceThreads];
  double l = 0.0;
  long long k = 0;
  for (int r = threadIdx.x; r < rows; r += kReduceThreads) {
    l += row_loss[r];
    k += row_correct[r];
  }
  loss[threadIdx.x] = l;
  correct[threadIdx.x] = k;
  __syncthreads();
  for (int stride = kReduceThreads / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) {
      loss[threadIdx.x] += loss[threadIdx.x + stride];
      correct[threadIdx.x] += correct[threadIdx.x + stride];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    totals->loss_sum = loss[0];
    totals->correct = correct[0];
  }
}

}  // namespace

cudaError_t CheckKernelImage() {
  cudaFuncAttributes attributes;
  return cudaFuncGetAttributes(&attributes, SoftmaxXentRowsKernel);
}

cudaError_t LaunchFill(float* x, size_t n, float value, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  FillKernel<<<BlocksFor(n), kThreads, 0, stream>>>(x, n, value);
  return cudaGetLastError();
}

cudaError_t LaunchScale(float* x, size_t n, float beta, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ScaleKernel<<<BlocksFor(n), kThreads, 0, stream>>>(x, n, beta);
  return cudaGetLastError();
}

cudaError_t LaunchBiasActivation(float* y, const float* bias, int rows,
                                 int cols, bool relu, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(cols);
  if (n == 0) return cudaSuccess;
  if (relu) {
    BiasActivationKernel<true>
        <<<BlocksFor(n), kThreads, 0, stream>>>(y, bias, n, cols);
  } else {
    BiasActivationKernel<false>
        <<<BlocksFor(n), kThreads, 0, stream>>>(y, bias, n, cols);
  }
  return cudaGetLastError();
}

cudaError_t LaunchReluBackward(float* dy, const float* y, size_t n,
                               cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ReluBackwardKernel<<<BlocksFor(n), kThreads, 0, stream>>>(dy, y, n);
  return cudaGetLastError();
}

cudaError_t LaunchColumnSum(const float* x, int rows, int cols, float* out,
                            cudaStream_t stream) {
  if (cols <= 0) return cudaSuccess;
  const unsigned int blocks = static_cast<unsigned int>((cols + 31) / 32);
  ColumnSumKernel<<<blocks, dim3(32, kColSumRows), 0, stream>>>(x, rows, cols,
                                                                out);
  return cudaGetLastError();
}

cudaError_t LaunchSoftmaxXent(const float* logits, const int32_t* labels,
                              int rows, int cols, float* dlogits,
                              float* row_loss, int32_t* row_correct,
                              XentTotals* totals, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const unsigned int blocks = static_cast<unsigned int>(
      (rows + kXentWarpsPerBlock - 1) / kXentWarpsPerBlock);
  SoftmaxXentRowsKernel<<<blocks, kXentWarpsPerBlock * 32, 0, stream>>>(
      logits, labels, rows, cols, dlogits, row_loss, row_correct);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  XentReduceKernel<<<1, kReduceThreads, 0, stream>>>(row_loss, row_correct,
                                                     rows, totals);
  return cudaGetLastError();
}

}  // namespace cuda_kernels
}  // namespace asyncps
