#ifndef ASYNCPS_COMMON_TENSOR_LAYOUT_H_
#define ASYNCPS_COMMON_TENSOR_LAYOUT_H_

// How a dense tensor is cut into slices, the unit of sharding, locking,
// versions and pushes: a TensorLayout turns a shape and a slice size into
// the number of slices and each one's element range, the same on every
// worker and shard. Which shard holds a slice is the ShardMap's answer
// (common/shard_map.h).
//
// Example:
//
//   absl::StatusOr<TensorLayout> layout =
//       TensorLayout::Create({784, 10}, /*slice_elems=*/4096);
//   if (!layout.ok()) return layout.status();  // a bad shape or slice size
//   // 7840 elements: slices [0, 4096) and [4096, 7840).
//   for (uint32_t i = 0; i < layout->num_slices(); ++i) {
//     const int64_t begin = layout->SliceBegin(i);  // 0, 4096
//     const int64_t size = layout->SliceSize(i);    // 4096, 3744
//     const int shard = map.SliceHome("w", i);  // a ShardMap
//   }

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

// How a dense tensor's row-major elements are cut into slices: slice i holds
// elements [i * slice_elems, min((i + 1) * slice_elems, num_elems)).
// A value type; thread-compatible.
class TensorLayout {
 public:
  // Validates the shape (non-empty, every dimension > 0, total fits in
  // int64) and slice size (> 0).
  static absl::StatusOr<TensorLayout> Create(const std::vector<int64_t>& shape,
                                             int64_t slice_elems);
  // Same, from a spec whose slice_elems is already resolved.
  static absl::StatusOr<TensorLayout> FromSpec(const TensorSpec& spec);

  int64_t num_elems() const { return num_elems_; }
  int64_t slice_elems() const { return slice_elems_; }
  uint32_t num_slices() const { return num_slices_; }
  int64_t SliceBegin(uint32_t slice) const { return slice * slice_elems_; }
  int64_t SliceSize(uint32_t slice) const;

  // fan_in / fan_out for Glorot initialization: a 2-D [rows, cols] weight
  // has fan_in = rows, fan_out = cols; 1-D tensors use their length for both.
  int64_t fan_in() const { return fan_in_; }
  int64_t fan_out() const { return fan_out_; }

 private:
  TensorLayout() = default;
  int64_t num_elems_ = 0;
  int64_t slice_elems_ = 0;
  uint32_t num_slices_ = 0;
  int64_t fan_in_ = 0;
  int64_t fan_out_ = 0;
};

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_TENSOR_LAYOUT_H_
