// The CUDA Backend: one GPU, one stream, cuBLAS for GEMM and the kernels of
// kernels/cuda_backend.cu for everything else. Built only with --config=cuda.
//
// Errors (see kernels/backend.h). Arguments are checked by the same
// kernels/backend_checks.h as the CPU backend before anything is issued, so
// a bad call never reaches a kernel. A failing CUDA runtime or cuBLAS call
// becomes a Status naming the Backend operation, the call and the error:
// "Gemm: cublasSgemm: CUBLAS_STATUS_EXECUTION_FAILED (...)",
// "Alloc(1048576 floats): cudaMalloc: cudaErrorMemoryAllocation (...)".
// Allocation failures are RESOURCE_EXHAUSTED, everything else INTERNAL.
// Nothing is logged here: the caller decides.

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/backend.h"
#include "kernels/backend_checks.h"
#include "kernels/cuda_kernels.h"

namespace asyncps {
namespace {

std::string CudaErrorText(cudaError_t err) {
  return absl::StrCat(cudaGetErrorName(err), " (", cudaGetErrorString(err),
                      ")");
}

std::string CublasErrorText(cublasStatus_t st) {
  return absl::StrCat(cublasGetStatusName(st), " (", cublasGetStatusString(st),
                      ")");
}

// OK for cudaSuccess; else "<op>: <call>: <error name> (<description>)",
// RESOURCE_EXHAUSTED for allocation failures and INTERNAL otherwise.
absl::Status CudaCheck(cudaError_t err, absl::string_view op,
                       absl::string_view call) {
  if (err == cudaSuccess) return absl::OkStatus();
  // A failing runtime call also becomes the thread's "last error"; reset it,
  // or the next kernel launch check would report it again. (Sticky errors
  // keep failing every later call anyway.)
  cudaGetLastError();
  std::string message = absl::StrCat(op, ": ", call, ": ", CudaErrorText(err));
  if (err == cudaErrorMemoryAllocation) {
    return absl::ResourceExhaustedError(message);
  }
  return absl::InternalError(message);
}

// As CudaCheck, for cuBLAS.
absl::Status CublasCheck(cublasStatus_t st, absl::string_view op,
                         absl::string_view call) {
  if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  cudaGetLastError();  // as in CudaCheck
  std::string message = absl::StrCat(op, ": ", call, ": ", CublasErrorText(st));
  if (st == CUBLAS_STATUS_ALLOC_FAILED) {
    return absl::ResourceExhaustedError(message);
  }
  return absl::InternalError(message);
}

// Backend on GPU `device_`. All work goes to stream_ (non-blocking with
// respect to the legacy default stream); cublas_ is bound to it, so GEMMs and
// kernels run in issue order.
//
// Not thread-safe (one training loop owns it), but it may be used from any
// one thread at a time: each call makes device_ current on the calling
// thread first.
class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {}
  ~CudaBackend() override;

  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  // Creates the stream, the cuBLAS handle and the small result buffers.
  // Called once by MakeCudaBackend; on error the object is only destroyed.
  absl::Status Init();

  std::string name() const override { return absl::StrCat("cuda:", device_); }

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
  absl::StatusOr<SoftmaxXentResult> SoftmaxCrossEntropy(
      const float* logits, const int32_t* labels, int rows, int cols,
      float* dlogits) override;
  absl::Status Synchronize() override;

 private:
  // Makes device_ current on the calling thread; `op` names the caller.
  absl::Status Activate(absl::string_view op) {
    return CudaCheck(cudaSetDevice(device_), op, "cudaSetDevice");
  }
  // Waits for stream_; errors of earlier work surface here.
  absl::Status Wait(absl::string_view op) {
    return CudaCheck(cudaStreamSynchronize(stream_), op,
                     "cudaStreamSynchronize (error of work issued earlier)");
  }
  // The shape of most operations: `checked` is the argument check; when it
  // failed or the operation is `empty`, returns it with no device work;
  // otherwise makes the device current and returns the cudaError_t of
  // `call()` as a Status of operation `op`, the call named `what`.
  template <typename Call>
  absl::Status Issue(const absl::Status& checked, bool empty,
                     absl::string_view op, absl::string_view what, Call call) {
    if (!checked.ok() || empty) return checked;
    absl::Status s = Activate(op);
    if (!s.ok()) return s;
    return CudaCheck(call(), op, what);
  }
  // Grows the per-row scratch of SoftmaxCrossEntropy to hold `rows`.
  absl::Status ReserveXentScratch(int rows);

  const int device_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;

  // SoftmaxCrossEntropy scratch, reused across calls (capacity xent_rows_).
  int xent_rows_ = 0;
  int32_t* labels_dev_ = nullptr;
  float* row_loss_dev_ = nullptr;
  int32_t* row_correct_dev_ = nullptr;
  cuda_kernels::XentTotals* totals_dev_ = nullptr;
  cuda_kernels::XentTotals* totals_host_ = nullptr;  // pinned
};

absl::Status CudaBackend::Init() {
  cudaError_t err = cudaSetDevice(device_);
  if (err != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat(
        "cannot use CUDA device ", device_, ": ", CudaErrorText(err)));
  }
  cudaDeviceProp prop;
  err = cudaGetDeviceProperties(&prop, device_);
  if (err != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat(
        "cudaGetDeviceProperties(", device_, "): ", CudaErrorText(err)));
  }
  // The kernels are built as sm_90 SASS + compute_90 PTX: older GPUs cannot
  // run them (newer ones JIT the PTX).
  err = cuda_kernels::CheckKernelImage();
  if (prop.major < 9 || err != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat(
        "CUDA device ", device_, " (", prop.name, ", compute capability ",
        prop.major, ".", prop.minor,
        ") cannot run this build's kernels (built for sm_90+)",
        err != cudaSuccess ? absl::StrCat(": ", CudaErrorText(err)) : ""));
  }
  absl::Status s =
      CudaCheck(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                "CUDA setup", "cudaStreamCreateWithFlags");
  if (!s.ok()) {
    stream_ = nullptr;
    return s;
  }
  s = CublasCheck(cublasCreate(&cublas_), "CUDA setup", "cublasCreate");
  if (!s.ok()) {
    cublas_ = nullptr;
    return s;
  }
  s = CublasCheck(cublasSetStream(cublas_, stream_), "CUDA setup",
                  "cublasSetStream");
  if (!s.ok()) return s;
  // Plain fp32 FMA GEMMs, never TF32: parity with the CPU backend depends
  // on it, and SGD gradients are the kind of data TF32 would perturb.
  s = CublasCheck(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH), "CUDA setup",
                  "cublasSetMathMode");
  if (!s.ok()) return s;
  s = CudaCheck(cudaMalloc(reinterpret_cast<void**>(&totals_dev_),
                           sizeof(cuda_kernels::XentTotals)),
                "CUDA setup", "cudaMalloc(xent totals)");
  if (!s.ok()) return s;
  return CudaCheck(cudaMallocHost(reinterpret_cast<void**>(&totals_host_),
                                  sizeof(cuda_kernels::XentTotals)),
                   "CUDA setup", "cudaMallocHost(xent totals)");
}

CudaBackend::~CudaBackend() {
  // Best effort: errors here cannot be reported any more.
  cudaSetDevice(device_);
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  cudaFree(labels_dev_);
  cudaFree(row_loss_dev_);
  cudaFree(row_correct_dev_);
  cudaFree(totals_dev_);
  if (totals_host_ != nullptr) cudaFreeHost(totals_host_);
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::StatusOr<float*> CudaBackend::Alloc(size_t n) {
  if (n == 0) return nullptr;
  const std::string op = absl::StrCat("Alloc(", n, " floats)");
  absl::Status s = backend_checks::AllocSize("Alloc", n);
  if (s.ok()) s = Activate(op);
  void* p = nullptr;
  if (s.ok()) {
    s = CudaCheck(cudaMalloc(&p, n * sizeof(float)), op, "cudaMalloc");
  }
  if (!s.ok()) return s;
  return static_cast<float*>(p);
}

absl::Status CudaBackend::Free(float* p) {
  if (p == nullptr) return absl::OkStatus();
  absl::Status s = Activate("Free");
  if (!s.ok()) return s;
  return CudaCheck(cudaFree(p), "Free", "cudaFree");
}

absl::StatusOr<float*> CudaBackend::AllocHost(size_t n) {
  if (n == 0) return nullptr;
  const std::string op = absl::StrCat("AllocHost(", n, " floats)");
  absl::Status s = backend_checks::AllocSize("AllocHost", n);
  if (s.ok()) s = Activate(op);
  void* p = nullptr;
  if (s.ok()) {
    s = CudaCheck(cudaMallocHost(&p, n * sizeof(float)), op, "cudaMallocHost");
  }
  if (!s.ok()) return s;
  return static_cast<float*>(p);
}

absl::Status CudaBackend::FreeHost(float* p) {
  if (p == nullptr) return absl::OkStatus();
  absl::Status s = Activate("FreeHost");
  if (!s.ok()) return s;
  return CudaCheck(cudaFreeHost(p), "FreeHost", "cudaFreeHost");
}

absl::Status CudaBackend::CopyToDevice(float* dst, const float* src, size_t n) {
  constexpr char kOp[] = "CopyToDevice";
  return Issue(backend_checks::Copy(kOp, dst, src, n), n == 0, kOp,
               "cudaMemcpyAsync", [&] {
                 return cudaMemcpyAsync(dst, src, n * sizeof(float),
                                        cudaMemcpyHostToDevice, stream_);
               });
}

absl::Status CudaBackend::CopyToHost(float* dst, const float* src, size_t n) {
  constexpr char kOp[] = "CopyToHost";
  absl::Status s =
      Issue(backend_checks::Copy(kOp, dst, src, n), n == 0, kOp,
            "cudaMemcpyAsync", [&] {
              return cudaMemcpyAsync(dst, src, n * sizeof(float),
                                     cudaMemcpyDeviceToHost, stream_);
            });
  if (!s.ok() || n == 0) return s;
  return Wait(kOp);
}

absl::Status CudaBackend::Fill(float* x, size_t n, float value) {
  return Issue(backend_checks::Fill(x, n), n == 0, "Fill", "FillKernel launch",
               [&] { return cuda_kernels::LaunchFill(x, n, value, stream_); });
}

absl::Status CudaBackend::Gemm(bool trans_a, bool trans_b, int m, int n, int k,
                               float alpha, const float* a, const float* b,
                               float beta, float* c) {
  const bool empty = m == 0 || n == 0;
  absl::Status s = backend_checks::Gemm(m, n, k, a, b, c);
  if (k == 0) {
    // C = beta * C; cuBLAS would reject the zero leading dimensions.
    return Issue(s, empty, "Gemm", "ScaleKernel launch (k = 0)", [&] {
      return cuda_kernels::LaunchScale(c, static_cast<size_t>(m) * n, beta,
                                       stream_);
    });
  }
  if (!s.ok() || empty) return s;
  s = Activate("Gemm");
  if (!s.ok()) return s;
  // cuBLAS is column-major. A row-major R x C matrix with leading dimension C
  // is, to cuBLAS, its C x R transpose, so the row-major C = op(A) op(B) is
  // computed as the column-major C^T (n x m, ldc = n) = op(B)^T op(A)^T:
  // B is passed first, and each operand's stored row length is its ld.
  const int lda = trans_a ? m : k;  // A stored m x k, or k x m when trans_a
  const int ldb = trans_b ? k : n;  // B stored k x n, or n x k when trans_b
  return CublasCheck(cublasSgemm(cublas_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k,
                                 &alpha, b, ldb, a, lda, &beta, c, n),
                     "Gemm", "cublasSgemm");
}

absl::Status CudaBackend::BiasActivation(float* y, const float* bias, int rows,
                                         int cols, bool relu) {
  return Issue(backend_checks::BiasActivation(y, bias, rows, cols),
               rows == 0 || cols == 0, "BiasActivation",
               "BiasActivationKernel launch", [&] {
                 return cuda_kernels::LaunchBiasActivation(y, bias, rows, cols,
                                                           relu, stream_);
               });
}

absl::Status CudaBackend::ReluBackward(float* dy, const float* y, size_t n) {
  return Issue(backend_checks::ReluBackward(dy, y, n), n == 0, "ReluBackward",
               "ReluBackwardKernel launch", [&] {
                 return cuda_kernels::LaunchReluBackward(dy, y, n, stream_);
               });
}

absl::Status CudaBackend::ColumnSum(const float* x, int rows, int cols,
                                    float* out) {
  return Issue(backend_checks::ColumnSum(x, rows, cols, out), cols == 0,
               "ColumnSum", "ColumnSumKernel launch", [&] {
                 return cuda_kernels::LaunchColumnSum(x, rows, cols, out,
                                                      stream_);
               });
}

absl::Status CudaBackend::ReserveXentScratch(int rows) {
  if (rows <= xent_rows_) return absl::OkStatus();
  cudaFree(labels_dev_);
  cudaFree(row_loss_dev_);
  cudaFree(row_correct_dev_);
  labels_dev_ = nullptr;
  row_loss_dev_ = nullptr;
  row_correct_dev_ = nullptr;
  xent_rows_ = 0;
  constexpr char kOp[] = "SoftmaxCrossEntropy";
  const size_t n = static_cast<size_t>(rows);
  absl::Status s = CudaCheck(
      cudaMalloc(reinterpret_cast<void**>(&labels_dev_), n * sizeof(int32_t)),
      kOp, "cudaMalloc(labels)");
  if (s.ok()) {
    s = CudaCheck(
        cudaMalloc(reinterpret_cast<void**>(&row_loss_dev_), n * sizeof(float)),
        kOp, "cudaMalloc(row losses)");
  }
  if (s.ok()) {
    s = CudaCheck(cudaMalloc(reinterpret_cast<void**>(&row_correct_dev_),
                             n * sizeof(int32_t)),
                  kOp, "cudaMalloc(row hits)");
  }
  if (s.ok()) xent_rows_ = rows;
  return s;
}

absl::StatusOr<SoftmaxXentResult> CudaBackend::SoftmaxCrossEntropy(
    const float* logits, const int32_t* labels, int rows, int cols,
    float* dlogits) {
  constexpr char kOp[] = "SoftmaxCrossEntropy";
  // Also rejects labels outside [0, cols), which would make the kernel read
  // out of bounds.
  absl::Status s =
      backend_checks::SoftmaxCrossEntropy(logits, labels, rows, cols);
  if (!s.ok()) return s;
  SoftmaxXentResult result;
  if (rows == 0 || cols == 0) return result;  // as the CPU backend
  s = Activate(kOp);
  if (s.ok()) s = ReserveXentScratch(rows);
  // Labels are pageable host memory: the copy is staged before it returns,
  // so the caller's array may change as soon as we return.
  if (s.ok()) {
    s = CudaCheck(cudaMemcpyAsync(labels_dev_, labels,
                                  static_cast<size_t>(rows) * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, stream_),
                  kOp, "cudaMemcpyAsync(labels)");
  }
  if (s.ok()) {
    s = CudaCheck(cuda_kernels::LaunchSoftmaxXent(
                      logits, labels_dev_, rows, cols, dlogits, row_loss_dev_,
                      row_correct_dev_, totals_dev_, stream_),
                  kOp, "SoftmaxXent kernel launch");
  }
  if (s.ok()) {
    s = CudaCheck(cudaMemcpyAsync(totals_host_, totals_dev_,
                                  sizeof(cuda_kernels::XentTotals),
                                  cudaMemcpyDeviceToHost, stream_),
                  kOp, "cudaMemcpyAsync(xent totals)");
  }
  if (s.ok()) s = Wait(kOp);
  if (!s.ok()) return s;
  result.mean_loss = totals_host_->loss_sum / rows;
  result.correct = totals_host_->correct;
  return result;
}

absl::Status CudaBackend::Synchronize() {
  absl::Status s = Activate("Synchronize");
  if (!s.ok()) return s;
  return Wait("Synchronize");
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the (non-sticky) error
    return absl::UnavailableError(absl::StrCat(
        "no usable CUDA device: cudaGetDeviceCount failed: ",
        CudaErrorText(err), "; is an NVIDIA GPU and driver present?"));
  }
  if (count == 0) {
    return absl::UnavailableError(
        "no CUDA device: cudaGetDeviceCount returned 0");
  }
  if (device < 0 || device >= count) {
    return absl::UnavailableError(
        absl::StrCat("CUDA device ", device, " does not exist (", count,
                     " device(s) present, numbered from 0)"));
  }
  auto backend = std::make_unique<CudaBackend>(device);
  absl::Status status = backend->Init();
  if (!status.ok()) return status;
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace asyncps
