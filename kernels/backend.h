#ifndef ASYNCPS_KERNELS_BACKEND_H_
#define ASYNCPS_KERNELS_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace asyncps {

// Result of a fused softmax cross-entropy forward/backward over a minibatch.
struct SoftmaxXentResult {
  double mean_loss = 0;  // mean over rows of -log softmax(logits)[label]
  int64_t correct = 0;   // rows whose argmax equals the label
};

// The compute backend the models run on: dense float32 math on memory the
// backend owns ("device memory"; host RAM for the CPU backend, GPU memory for
// CUDA). All matrices are row-major. Operations are issued in order on one
// stream; Copy* and SoftmaxCrossEntropy synchronize as documented.
//
// A Backend is not thread-safe: one training loop owns one Backend.
class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu" or "cuda:<device>"; for logs.
  virtual std::string name() const = 0;

  // Device memory, uninitialized. Free(nullptr) is a no-op.
  virtual float* Alloc(size_t n) = 0;
  virtual void Free(float* p) = 0;
  // Host memory suited to fast transfers (pinned for CUDA).
  virtual float* AllocHost(size_t n) = 0;
  virtual void FreeHost(float* p) = 0;

  // Host -> device; `src` must stay unchanged until the next Synchronize().
  virtual void CopyToDevice(float* dst, const float* src, size_t n) = 0;
  // Device -> host; returns when the data is in `dst`.
  virtual void CopyToHost(float* dst, const float* src, size_t n) = 0;
  virtual void Fill(float* x, size_t n, float value) = 0;

  // C[m x n] = alpha * op(A) * op(B) + beta * C, where op(A) is m x k and
  // op(B) is k x n; op transposes when trans_* is true (A stored k x m, B
  // stored n x k).
  virtual void Gemm(bool trans_a, bool trans_b, int m, int n, int k,
                    float alpha, const float* a, const float* b, float beta,
                    float* c) = 0;

  // y[r][c] += bias[c] for a rows x cols y; then y = max(y, 0) if relu.
  virtual void BiasActivation(float* y, const float* bias, int rows, int cols,
                              bool relu) = 0;

  // dy[i] = y[i] > 0 ? dy[i] : 0 (y is the ReLU output), in place.
  virtual void ReluBackward(float* dy, const float* y, size_t n) = 0;

  // out[c] = sum over r of x[r][c], for a rows x cols x.
  virtual void ColumnSum(const float* x, int rows, int cols, float* out) = 0;

  // Numerically stable softmax cross-entropy of `logits` (rows x cols) with
  // integer labels (host memory, each in [0, cols)). When dlogits is not
  // null it receives d(mean loss)/d(logits) = (softmax - onehot) / rows.
  // Synchronizes.
  virtual SoftmaxXentResult SoftmaxCrossEntropy(const float* logits,
                                                const int32_t* labels,
                                                int rows, int cols,
                                                float* dlogits) = 0;

  // Waits for all issued work.
  virtual void Synchronize() = 0;
};

// Which of a Backend's memories a BackendBuffer holds.
enum class MemoryKind { kDevice, kHost };

// An owned allocation of a Backend: device memory (DeviceBuffer) or fast
// host memory (HostBuffer, pinned for CUDA). Move-only.
template <MemoryKind kKind>
class BackendBuffer {
 public:
  BackendBuffer() = default;
  BackendBuffer(Backend* backend, size_t n)  // backend not owned
      : backend_(backend), data_(n ? Allocate(backend, n) : nullptr), size_(n) {}
  ~BackendBuffer() { Release(); }
  BackendBuffer(BackendBuffer&& o) noexcept { *this = std::move(o); }
  BackendBuffer& operator=(BackendBuffer&& o) noexcept {
    if (this != &o) {
      Release();
      backend_ = o.backend_;
      data_ = o.data_;
      size_ = o.size_;
      o.backend_ = nullptr;
      o.data_ = nullptr;
      o.size_ = 0;
    }
    return *this;
  }
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;

  float* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  static float* Allocate(Backend* backend, size_t n) {
    return kKind == MemoryKind::kDevice ? backend->Alloc(n)
                                        : backend->AllocHost(n);
  }
  void Release() {
    if (backend_ == nullptr) return;
    if (kKind == MemoryKind::kDevice) {
      backend_->Free(data_);
    } else {
      backend_->FreeHost(data_);
    }
  }

  Backend* backend_ = nullptr;
  float* data_ = nullptr;
  size_t size_ = 0;
};

using DeviceBuffer = BackendBuffer<MemoryKind::kDevice>;
using HostBuffer = BackendBuffer<MemoryKind::kHost>;

// The CPU backend (OpenBLAS cblas_sgemm + vectorizable loops).
std::unique_ptr<Backend> MakeCpuBackend();

// The CUDA backend on GPU `device`. UNAVAILABLE when asyncps was built
// without --config=cuda or no CUDA device is present.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device);

// "cpu", "cuda", or "auto" (CUDA when a device is present, else CPU).
// INVALID_ARGUMENT for other names; UNAVAILABLE for "cuda" without a GPU.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const std::string& device);

}  // namespace asyncps

#endif  // ASYNCPS_KERNELS_BACKEND_H_
