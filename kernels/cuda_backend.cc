// The CUDA Backend: one GPU, one stream, cuBLAS for GEMM and the kernels of
// kernels/cuda_backend.cu for everything else. Built only with --config=cuda.
//
// Errors. Backend's methods return nothing, so a failing CUDA or cuBLAS call
// (or an argument that would make a kernel fault, such as a null pointer or a
// negative size) never aborts: it is logged to stderr (the interface carries
// no logger; at most kMaxLoggedErrors messages per backend) and remembered:
// the next SoftmaxCrossEntropy reports mean_loss = NaN when it, or any call
// since the previous SoftmaxCrossEntropy, failed. A training step thus sees
// the failure of any operation in it through its loss.

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/backend.h"
#include "kernels/cuda_kernels.h"

namespace asyncps {
namespace {

constexpr int kMaxLoggedErrors = 16;

std::string CudaErrorText(cudaError_t err) {
  return absl::StrCat(cudaGetErrorName(err), " (", cudaGetErrorString(err),
                      ")");
}

std::string CublasErrorText(cublasStatus_t st) {
  return absl::StrCat(cublasGetStatusName(st), " (", cublasGetStatusString(st),
                      ")");
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
  SoftmaxXentResult SoftmaxCrossEntropy(const float* logits,
                                        const int32_t* labels, int rows,
                                        int cols, float* dlogits) override;
  void Synchronize() override;

 private:
  // Each returns true on success; on failure it logs the error and sets
  // failed_since_xent_.
  bool Check(cudaError_t err, const char* what);
  bool Check(cublasStatus_t st, const char* what);
  bool Fail(absl::Status status);
  // Makes device_ current on the calling thread.
  bool Activate() { return Check(cudaSetDevice(device_), "cudaSetDevice"); }
  // SoftmaxCrossEntropy without the failure bookkeeping; false on error.
  bool RunSoftmaxXent(const float* logits, const int32_t* labels, int rows,
                      int cols, float* dlogits, SoftmaxXentResult* result);
  // Grows the per-row scratch of SoftmaxCrossEntropy to hold `rows`.
  bool ReserveXentScratch(int rows);

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

  // Whether a call failed since the last SoftmaxCrossEntropy.
  bool failed_since_xent_ = false;
  int logged_errors_ = 0;
};

bool CudaBackend::Fail(absl::Status status) {
  if (logged_errors_ < kMaxLoggedErrors) {
    std::fprintf(stderr, "asyncps %s backend error: %s%s\n", name().c_str(),
                 status.ToString().c_str(),
                 logged_errors_ + 1 == kMaxLoggedErrors
                     ? " (further errors of this backend are not logged)"
                     : "");
    ++logged_errors_;
  }
  failed_since_xent_ = true;
  return false;
}

bool CudaBackend::Check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return true;
  return Fail(
      absl::InternalError(absl::StrCat(what, ": ", CudaErrorText(err))));
}

bool CudaBackend::Check(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return true;
  return Fail(
      absl::InternalError(absl::StrCat(what, ": ", CublasErrorText(st))));
}

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
  err = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
  if (err != cudaSuccess) {
    stream_ = nullptr;
    return absl::InternalError(
        absl::StrCat("cudaStreamCreate: ", CudaErrorText(err)));
  }
  cublasStatus_t st = cublasCreate(&cublas_);
  if (st != CUBLAS_STATUS_SUCCESS) {
    cublas_ = nullptr;
    return absl::InternalError(
        absl::StrCat("cublasCreate: ", CublasErrorText(st)));
  }
  st = cublasSetStream(cublas_, stream_);
  if (st == CUBLAS_STATUS_SUCCESS) {
    // Plain fp32 FMA GEMMs, never TF32: parity with the CPU backend depends
    // on it, and SGD gradients are the kind of data TF32 would perturb.
    st = cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH);
  }
  if (st != CUBLAS_STATUS_SUCCESS) {
    return absl::InternalError(
        absl::StrCat("cublas setup: ", CublasErrorText(st)));
  }
  err = cudaMalloc(reinterpret_cast<void**>(&totals_dev_),
                   sizeof(cuda_kernels::XentTotals));
  if (err == cudaSuccess) {
    err = cudaMallocHost(reinterpret_cast<void**>(&totals_host_),
                         sizeof(cuda_kernels::XentTotals));
  }
  if (err != cudaSuccess) {
    return absl::ResourceExhaustedError(
        absl::StrCat("CUDA result buffers: ", CudaErrorText(err)));
  }
  return absl::OkStatus();
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

float* CudaBackend::Alloc(size_t n) {
  if (n == 0 || !Activate()) return nullptr;
  if (n > std::numeric_limits<size_t>::max() / sizeof(float)) {
    Fail(absl::InvalidArgumentError(absl::StrCat("Alloc(", n, "): too large")));
    return nullptr;
  }
  void* p = nullptr;
  if (!Check(cudaMalloc(&p, n * sizeof(float)), "cudaMalloc")) return nullptr;
  return static_cast<float*>(p);
}

void CudaBackend::Free(float* p) {
  if (p == nullptr || !Activate()) return;
  Check(cudaFree(p), "cudaFree");
}

float* CudaBackend::AllocHost(size_t n) {
  if (n == 0 || !Activate()) return nullptr;
  if (n > std::numeric_limits<size_t>::max() / sizeof(float)) {
    Fail(absl::InvalidArgumentError(
        absl::StrCat("AllocHost(", n, "): too large")));
    return nullptr;
  }
  void* p = nullptr;
  if (!Check(cudaMallocHost(&p, n * sizeof(float)), "cudaMallocHost")) {
    return nullptr;
  }
  return static_cast<float*>(p);
}

void CudaBackend::FreeHost(float* p) {
  if (p == nullptr || !Activate()) return;
  Check(cudaFreeHost(p), "cudaFreeHost");
}

void CudaBackend::CopyToDevice(float* dst, const float* src, size_t n) {
  if (n == 0 || !Activate()) return;
  if (dst == nullptr || src == nullptr) {
    Fail(absl::InvalidArgumentError("CopyToDevice: null pointer"));
    return;
  }
  Check(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyHostToDevice,
                        stream_),
        "cudaMemcpyAsync(host to device)");
}

void CudaBackend::CopyToHost(float* dst, const float* src, size_t n) {
  if (n == 0 || !Activate()) return;
  if (dst == nullptr || src == nullptr) {
    Fail(absl::InvalidArgumentError("CopyToHost: null pointer"));
    return;
  }
  if (Check(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost,
                            stream_),
            "cudaMemcpyAsync(device to host)")) {
    Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
}

void CudaBackend::Fill(float* x, size_t n, float value) {
  if (n == 0 || !Activate()) return;
  if (x == nullptr) {
    Fail(absl::InvalidArgumentError("Fill: null pointer"));
    return;
  }
  Check(cuda_kernels::LaunchFill(x, n, value, stream_), "Fill kernel");
}

void CudaBackend::Gemm(bool trans_a, bool trans_b, int m, int n, int k,
                       float alpha, const float* a, const float* b, float beta,
                       float* c) {
  if (m < 0 || n < 0 || k < 0) {
    Fail(absl::InvalidArgumentError(
        absl::StrCat("Gemm: negative size m=", m, " n=", n, " k=", k)));
    return;
  }
  if (m == 0 || n == 0 || !Activate()) return;
  if (c == nullptr || (k > 0 && (a == nullptr || b == nullptr))) {
    Fail(absl::InvalidArgumentError("Gemm: null pointer"));
    return;
  }
  if (k == 0) {
    // C = beta * C; cuBLAS would reject the zero leading dimensions.
    Check(
        cuda_kernels::LaunchScale(c, static_cast<size_t>(m) * n, beta, stream_),
        "Gemm scale kernel");
    return;
  }
  // cuBLAS is column-major. A row-major R x C matrix with leading dimension C
  // is, to cuBLAS, its C x R transpose, so the row-major C = op(A) op(B) is
  // computed as the column-major C^T (n x m, ldc = n) = op(B)^T op(A)^T:
  // B is passed first, and each operand's stored row length is its ld.
  const int lda = trans_a ? m : k;  // A stored m x k, or k x m when trans_a
  const int ldb = trans_b ? k : n;  // B stored k x n, or n x k when trans_b
  Check(cublasSgemm(cublas_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                    trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b,
                    ldb, a, lda, &beta, c, n),
        "cublasSgemm");
}

void CudaBackend::BiasActivation(float* y, const float* bias, int rows,
                                 int cols, bool relu) {
  if (rows < 0 || cols < 0) {
    Fail(absl::InvalidArgumentError(absl::StrCat(
        "BiasActivation: negative size rows=", rows, " cols=", cols)));
    return;
  }
  if (rows == 0 || cols == 0 || !Activate()) return;
  if (y == nullptr || bias == nullptr) {
    Fail(absl::InvalidArgumentError("BiasActivation: null pointer"));
    return;
  }
  Check(cuda_kernels::LaunchBiasActivation(y, bias, rows, cols, relu, stream_),
        "BiasActivation kernel");
}

void CudaBackend::ReluBackward(float* dy, const float* y, size_t n) {
  if (n == 0 || !Activate()) return;
  if (dy == nullptr || y == nullptr) {
    Fail(absl::InvalidArgumentError("ReluBackward: null pointer"));
    return;
  }
  Check(cuda_kernels::LaunchReluBackward(dy, y, n, stream_),
        "ReluBackward kernel");
}

void CudaBackend::ColumnSum(const float* x, int rows, int cols, float* out) {
  if (rows < 0 || cols < 0) {
    Fail(absl::InvalidArgumentError(
        absl::StrCat("ColumnSum: negative size rows=", rows, " cols=", cols)));
    return;
  }
  if (cols == 0 || !Activate()) return;
  if (out == nullptr || (rows > 0 && x == nullptr)) {
    Fail(absl::InvalidArgumentError("ColumnSum: null pointer"));
    return;
  }
  Check(cuda_kernels::LaunchColumnSum(x, rows, cols, out, stream_),
        "ColumnSum kernel");
}

bool CudaBackend::ReserveXentScratch(int rows) {
  if (rows <= xent_rows_) return true;
  cudaFree(labels_dev_);
  cudaFree(row_loss_dev_);
  cudaFree(row_correct_dev_);
  labels_dev_ = nullptr;
  row_loss_dev_ = nullptr;
  row_correct_dev_ = nullptr;
  xent_rows_ = 0;
  const size_t n = static_cast<size_t>(rows);
  if (!Check(cudaMalloc(reinterpret_cast<void**>(&labels_dev_),
                        n * sizeof(int32_t)),
             "cudaMalloc(labels)") ||
      !Check(cudaMalloc(reinterpret_cast<void**>(&row_loss_dev_),
                        n * sizeof(float)),
             "cudaMalloc(row losses)") ||
      !Check(cudaMalloc(reinterpret_cast<void**>(&row_correct_dev_),
                        n * sizeof(int32_t)),
             "cudaMalloc(row hits)")) {
    return false;
  }
  xent_rows_ = rows;
  return true;
}

SoftmaxXentResult CudaBackend::SoftmaxCrossEntropy(const float* logits,
                                                   const int32_t* labels,
                                                   int rows, int cols,
                                                   float* dlogits) {
  SoftmaxXentResult result;
  const bool ok = RunSoftmaxXent(logits, labels, rows, cols, dlogits, &result);
  if (!ok || failed_since_xent_) {
    result.mean_loss = std::numeric_limits<double>::quiet_NaN();
  }
  failed_since_xent_ = false;
  return result;
}

bool CudaBackend::RunSoftmaxXent(const float* logits, const int32_t* labels,
                                 int rows, int cols, float* dlogits,
                                 SoftmaxXentResult* result) {
  if (rows <= 0 || cols <= 0) return true;  // zero result, as the CPU backend
  if (logits == nullptr || labels == nullptr) {
    return Fail(
        absl::InvalidArgumentError("SoftmaxCrossEntropy: null pointer"));
  }
  // A label outside [0, cols) would make the kernel read out of bounds.
  for (int r = 0; r < rows; ++r) {
    if (labels[r] < 0 || labels[r] >= cols) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("SoftmaxCrossEntropy: label ", labels[r], " of row ", r,
                       " is outside [0, ", cols, ")")));
    }
  }
  if (!Activate() || !ReserveXentScratch(rows)) return false;
  // Labels are pageable host memory: the copy is staged before it returns,
  // so the caller's array may change as soon as we return.
  if (!Check(cudaMemcpyAsync(labels_dev_, labels,
                             static_cast<size_t>(rows) * sizeof(int32_t),
                             cudaMemcpyHostToDevice, stream_),
             "cudaMemcpyAsync(labels)") ||
      !Check(cuda_kernels::LaunchSoftmaxXent(
                 logits, labels_dev_, rows, cols, dlogits, row_loss_dev_,
                 row_correct_dev_, totals_dev_, stream_),
             "SoftmaxXent kernel") ||
      !Check(cudaMemcpyAsync(totals_host_, totals_dev_,
                             sizeof(cuda_kernels::XentTotals),
                             cudaMemcpyDeviceToHost, stream_),
             "cudaMemcpyAsync(xent totals)") ||
      !Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize")) {
    return false;
  }
  result->mean_loss = totals_host_->loss_sum / rows;
  result->correct = totals_host_->correct;
  return true;
}

void CudaBackend::Synchronize() {
  if (!Activate()) return;
  Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
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
