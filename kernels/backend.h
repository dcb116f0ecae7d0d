#ifndef ASYNCPS_KERNELS_BACKEND_H_
#define ASYNCPS_KERNELS_BACKEND_H_

// The compute backend models train and serve on: Backend is dense float32
// math (GEMM, bias and ReLU, softmax cross-entropy) on memory it owns, host
// RAM for the CPU backend and GPU memory for CUDA, so that a model is
// written once for both. MakeBackend("auto") picks CUDA when a GPU is
// present; DeviceBuffer and HostBuffer free their memory themselves.
//
// Example (logits = x * w for 32 rows of 784 features, 10 classes):
//
//   absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend("auto");
//   if (!backend.ok()) return backend.status();
//   Backend* be = backend->get();
//   absl::StatusOr<DeviceBuffer> x = DeviceBuffer::Make(be, 32 * 784);
//   absl::StatusOr<DeviceBuffer> w = DeviceBuffer::Make(be, 784 * 10);
//   absl::StatusOr<DeviceBuffer> logits = DeviceBuffer::Make(be, 32 * 10);
//   if (!x.ok()) return x.status();  // likewise w and logits
//   absl::Status s = be->CopyToDevice(x->data(), host_x, 32 * 784);
//   if (s.ok()) s = be->CopyToDevice(w->data(), host_w, 784 * 10);
//   if (s.ok()) {
//     s = be->Gemm(false, false, 32, 10, 784, 1.0f, x->data(), w->data(),
//                  0.0f, logits->data());
//   }
//   if (!s.ok()) return s;
//   absl::StatusOr<SoftmaxXentResult> loss = be->SoftmaxCrossEntropy(
//       logits->data(), labels, 32, 10, /*dlogits=*/nullptr);  // waits

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
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
// Errors. Every operation that can fail returns absl::Status(Or); the
// message names the operation and, for CUDA, the runtime or cuBLAS error
// (e.g. "Gemm: cublasSgemm: CUBLAS_STATUS_EXECUTION_FAILED (...)").
// INVALID_ARGUMENT: a negative size, a null pointer where data is needed or
// a label out of range; nothing was issued then. RESOURCE_EXHAUSTED: an
// allocation failed. INTERNAL: the device reported an error. Device work
// runs asynchronously, so an error raised while a kernel runs is reported by
// the next call that waits for the stream (CopyToHost, SoftmaxCrossEntropy,
// Synchronize), naming that call; after such an error the device context may
// be unusable and every later call fail too (CUDA's sticky errors).
//
// A Backend is not thread-safe: one training loop owns one Backend.
class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu" or "cuda:<device>"; for logs.
  virtual std::string name() const = 0;

  // Device memory for n floats, uninitialized; nullptr for n == 0.
  // Free(nullptr) is a no-op. Prefer DeviceBuffer, which frees for you.
  virtual absl::StatusOr<float*> Alloc(size_t n) = 0;
  virtual absl::Status Free(float* p) = 0;
  // Host memory suited to fast transfers (pinned for CUDA); as Alloc/Free.
  virtual absl::StatusOr<float*> AllocHost(size_t n) = 0;
  virtual absl::Status FreeHost(float* p) = 0;

  // Host -> device; `src` must stay unchanged until the next Synchronize().
  virtual absl::Status CopyToDevice(float* dst, const float* src, size_t n) = 0;
  // Device -> host; returns when the data is in `dst` (or with the error of
  // any work issued before).
  virtual absl::Status CopyToHost(float* dst, const float* src, size_t n) = 0;
  virtual absl::Status Fill(float* x, size_t n, float value) = 0;

  // C[m x n] = alpha * op(A) * op(B) + beta * C, where op(A) is m x k and
  // op(B) is k x n; op transposes when trans_* is true (A stored k x m, B
  // stored n x k). m, n, k >= 0; with k == 0, C = beta * C.
  virtual absl::Status Gemm(bool trans_a, bool trans_b, int m, int n, int k,
                            float alpha, const float* a, const float* b,
                            float beta, float* c) = 0;

  // y[r][c] += bias[c] for a rows x cols y; then y = max(y, 0) if relu.
  virtual absl::Status BiasActivation(float* y, const float* bias, int rows,
                                      int cols, bool relu) = 0;

  // dy[i] = y[i] > 0 ? dy[i] : 0 (y is the ReLU output), in place.
  virtual absl::Status ReluBackward(float* dy, const float* y, size_t n) = 0;

  // out[c] = sum over r of x[r][c], for a rows x cols x.
  virtual absl::Status ColumnSum(const float* x, int rows, int cols,
                                 float* out) = 0;

  // Numerically stable softmax cross-entropy of `logits` (rows x cols) with
  // integer labels (host memory, each in [0, cols), else INVALID_ARGUMENT
  // naming the row). When dlogits is not null it receives d(mean loss)/
  // d(logits) = (softmax - onehot) / rows. rows or cols == 0 gives a zero
  // result. Synchronizes.
  virtual absl::StatusOr<SoftmaxXentResult> SoftmaxCrossEntropy(
      const float* logits, const int32_t* labels, int rows, int cols,
      float* dlogits) = 0;

  // Waits for all issued work; reports the first error it raised.
  virtual absl::Status Synchronize() = 0;
};

// Which of a Backend's memories a BackendBuffer holds.
enum class MemoryKind { kDevice, kHost };

// An owned allocation of a Backend: device memory (DeviceBuffer) or fast
// host memory (HostBuffer, pinned for CUDA). Move-only; an empty
// (default-constructed or moved-from) buffer holds nothing. The destructor
// frees the memory; an error of that Free cannot be returned and is dropped
// (it would resurface at the backend's next synchronizing call).
template <MemoryKind kKind>
class BackendBuffer {
 public:
  // n floats of `backend`'s memory (not owned; must outlive the buffer). An
  // empty buffer for n == 0; the backend's error when allocation fails.
  static absl::StatusOr<BackendBuffer> Make(Backend* backend, size_t n) {
    if (backend == nullptr) {
      return absl::InvalidArgumentError("BackendBuffer needs a backend");
    }
    absl::StatusOr<float*> p = kKind == MemoryKind::kDevice
                                   ? backend->Alloc(n)
                                   : backend->AllocHost(n);
    if (!p.ok()) return p.status();
    BackendBuffer buffer;
    buffer.backend_ = backend;
    buffer.data_ = *p;
    buffer.size_ = n;
    return buffer;
  }

  BackendBuffer() = default;
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
  void Release() {
    if (backend_ == nullptr || data_ == nullptr) return;
    absl::Status s = kKind == MemoryKind::kDevice ? backend_->Free(data_)
                                                  : backend_->FreeHost(data_);
    s.IgnoreError();
    data_ = nullptr;
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
