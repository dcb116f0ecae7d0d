#include "common/tensor_layout.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace asyncps {

absl::StatusOr<TensorLayout> TensorLayout::Create(
    const std::vector<int64_t>& shape, int64_t slice_elems) {
  if (shape.empty()) {
    return absl::InvalidArgumentError(
        "tensor shape must have at least one dimension");
  }
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor shape [", absl::StrJoin(shape, ","),
                       "] has a non-positive dimension"));
    }
    if (n > std::numeric_limits<int64_t>::max() / d) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor shape [", absl::StrJoin(shape, ","), "] is too large"));
    }
    n *= d;
  }
  if (slice_elems <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("slice_elems must be > 0, got ", slice_elems));
  }
  // n + slice_elems - 1 could overflow.
  const int64_t slices = n / slice_elems + (n % slice_elems != 0 ? 1 : 0);
  if (slices > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor of ", n, " elements needs ", slices, " slices of ",
                     slice_elems, "; use larger slices"));
  }
  TensorLayout layout;
  layout.num_elems_ = n;
  layout.slice_elems_ = slice_elems;
  layout.num_slices_ = static_cast<uint32_t>(slices);
  layout.fan_in_ = shape.size() >= 2 ? shape[0] : n;
  layout.fan_out_ = shape.size() >= 2 ? n / shape[0] : n;
  return layout;
}

absl::StatusOr<TensorLayout> TensorLayout::FromSpec(const TensorSpec& spec) {
  return Create(std::vector<int64_t>(spec.shape().begin(), spec.shape().end()),
                spec.slice_elems());
}

int64_t TensorLayout::SliceSize(uint32_t slice) const {
  const int64_t begin = SliceBegin(slice);
  return std::max<int64_t>(0, std::min(slice_elems_, num_elems_ - begin));
}

}  // namespace asyncps
