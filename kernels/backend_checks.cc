#include "kernels/backend_checks.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace asyncps {
namespace backend_checks {
namespace {

absl::Status NegativeSize(const char* op, const char* a, int64_t av,
                          const char* b, int64_t bv) {
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": negative size ", a, "=", av, " ", b, "=", bv));
}

absl::Status NullPointer(const char* op, const char* which) {
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", which, " is a null pointer"));
}

}  // namespace

absl::Status AllocSize(const char* op, size_t n) {
  if (n > std::numeric_limits<size_t>::max() / sizeof(float)) {
    return absl::ResourceExhaustedError(
        absl::StrCat(op, "(", n, " floats): larger than the address space"));
  }
  return absl::OkStatus();
}

absl::Status Copy(const char* op, const float* dst, const float* src,
                  size_t n) {
  if (n == 0) return absl::OkStatus();
  if (dst == nullptr) return NullPointer(op, "dst");
  if (src == nullptr) return NullPointer(op, "src");
  return absl::OkStatus();
}

absl::Status Fill(const float* x, size_t n) {
  if (n > 0 && x == nullptr) return NullPointer("Fill", "x");
  return absl::OkStatus();
}

absl::Status Gemm(int m, int n, int k, const float* a, const float* b,
                  const float* c) {
  if (m < 0 || n < 0 || k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Gemm: negative size m=", m, " n=", n, " k=", k));
  }
  if (m == 0 || n == 0) return absl::OkStatus();
  if (c == nullptr) return NullPointer("Gemm", "C");
  if (k > 0 && a == nullptr) return NullPointer("Gemm", "A");
  if (k > 0 && b == nullptr) return NullPointer("Gemm", "B");
  return absl::OkStatus();
}

absl::Status BiasActivation(const float* y, const float* bias, int rows,
                            int cols) {
  if (rows < 0 || cols < 0) {
    return NegativeSize("BiasActivation", "rows", rows, "cols", cols);
  }
  if (rows == 0 || cols == 0) return absl::OkStatus();
  if (y == nullptr) return NullPointer("BiasActivation", "y");
  if (bias == nullptr) return NullPointer("BiasActivation", "bias");
  return absl::OkStatus();
}

absl::Status ReluBackward(const float* dy, const float* y, size_t n) {
  if (n == 0) return absl::OkStatus();
  if (dy == nullptr) return NullPointer("ReluBackward", "dy");
  if (y == nullptr) return NullPointer("ReluBackward", "y");
  return absl::OkStatus();
}

absl::Status ColumnSum(const float* x, int rows, int cols, const float* out) {
  if (rows < 0 || cols < 0) {
    return NegativeSize("ColumnSum", "rows", rows, "cols", cols);
  }
  if (cols == 0) return absl::OkStatus();
  if (out == nullptr) return NullPointer("ColumnSum", "out");
  if (rows > 0 && x == nullptr) return NullPointer("ColumnSum", "x");
  return absl::OkStatus();
}

absl::Status SoftmaxCrossEntropy(const float* logits, const int32_t* labels,
                                 int rows, int cols) {
  constexpr char kOp[] = "SoftmaxCrossEntropy";
  if (rows < 0 || cols < 0)
    return NegativeSize(kOp, "rows", rows, "cols", cols);
  if (rows == 0 || cols == 0) return absl::OkStatus();
  if (logits == nullptr) return NullPointer(kOp, "logits");
  if (labels == nullptr) return NullPointer(kOp, "labels");
  for (int r = 0; r < rows; ++r) {
    if (labels[r] < 0 || labels[r] >= cols) {
      return absl::InvalidArgumentError(
          absl::StrCat(kOp, ": label ", labels[r], " of row ", r,
                       " is outside [0, ", cols, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace backend_checks
}  // namespace asyncps
