#ifndef ASYNCPS_TESTS_TESTING_FAULTY_BACKEND_H_
#define ASYNCPS_TESTS_TESTING_FAULTY_BACKEND_H_

// A compute Backend that fails one chosen call, for the tests of what models
// and training loops do with a device error. Example:
//
//   FaultyBackend backend("Gemm", 3, absl::InternalError("cublasSgemm: ..."));
//   auto mlp = Mlp::Create({6, 5, 3}, 4, &backend);  // the 3rd Gemm fails

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cpu_backend.h"

namespace asyncps {

// A CpuBackend that fails the `fail_at`-th call (counting from 1) of the
// operation named `fail_op` with `error`, as a CUDA backend reports a device
// error; every other call is the CPU's. Lets the tests see what a caller
// does with a backend error without a GPU.
class FaultyBackend final : public Backend {
 public:
  FaultyBackend(std::string fail_op, int fail_at, absl::Status error)
      : fail_op_(std::move(fail_op)), fail_at_(fail_at), error_(error) {}

  std::string name() const override { return "faulty-cpu"; }
  absl::StatusOr<float*> Alloc(size_t n) override {
    if (Fails("Alloc")) return error_;
    return cpu_.Alloc(n);
  }
  absl::Status Free(float* p) override { return cpu_.Free(p); }
  absl::StatusOr<float*> AllocHost(size_t n) override {
    if (Fails("AllocHost")) return error_;
    return cpu_.AllocHost(n);
  }
  absl::Status FreeHost(float* p) override { return cpu_.FreeHost(p); }
  absl::Status CopyToDevice(float* dst, const float* src, size_t n) override {
    return Fails("CopyToDevice") ? error_ : cpu_.CopyToDevice(dst, src, n);
  }
  absl::Status CopyToHost(float* dst, const float* src, size_t n) override {
    return Fails("CopyToHost") ? error_ : cpu_.CopyToHost(dst, src, n);
  }
  absl::Status Fill(float* x, size_t n, float value) override {
    return Fails("Fill") ? error_ : cpu_.Fill(x, n, value);
  }
  absl::Status Gemm(bool ta, bool tb, int m, int n, int k, float alpha,
                    const float* a, const float* b, float beta,
                    float* c) override {
    return Fails("Gemm") ? error_
                         : cpu_.Gemm(ta, tb, m, n, k, alpha, a, b, beta, c);
  }
  absl::Status BiasActivation(float* y, const float* bias, int rows, int cols,
                              bool relu) override {
    return Fails("BiasActivation")
               ? error_
               : cpu_.BiasActivation(y, bias, rows, cols, relu);
  }
  absl::Status ReluBackward(float* dy, const float* y, size_t n) override {
    return Fails("ReluBackward") ? error_ : cpu_.ReluBackward(dy, y, n);
  }
  absl::Status ColumnSum(const float* x, int rows, int cols,
                         float* out) override {
    return Fails("ColumnSum") ? error_ : cpu_.ColumnSum(x, rows, cols, out);
  }
  absl::StatusOr<SoftmaxXentResult> SoftmaxCrossEntropy(
      const float* logits, const int32_t* labels, int rows, int cols,
      float* dlogits) override {
    if (Fails("SoftmaxCrossEntropy")) return error_;
    return cpu_.SoftmaxCrossEntropy(logits, labels, rows, cols, dlogits);
  }
  absl::Status Synchronize() override {
    return Fails("Synchronize") ? error_ : cpu_.Synchronize();
  }

  // Calls of the failing operation so far.
  int calls() const { return calls_; }

 private:
  bool Fails(const char* op) {
    if (fail_op_ != op) return false;
    return ++calls_ == fail_at_;
  }

  CpuBackend cpu_;
  const std::string fail_op_;
  const int fail_at_;
  const absl::Status error_;
  int calls_ = 0;
};

}  // namespace asyncps

#endif  // ASYNCPS_TESTS_TESTING_FAULTY_BACKEND_H_
