#ifndef ASYNCPS_COMMON_INITIALIZER_H_
#define ASYNCPS_COMMON_INITIALIZER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/tensor_layout.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

// Checks the initializer fields of `spec` (init_value finite, and >= 0 for
// the random initializers).
absl::Status ValidateInitializer(const TensorSpec& spec);

// Writes the initial values of slice `slice` of the tensor described by
// (spec, layout) into out[0, layout.SliceSize(slice)). A pure function of
// its arguments: every shard, and a worker training locally, produce the
// same values without talking to each other.
void InitializeSlice(const TensorSpec& spec, const TensorLayout& layout,
                     uint32_t slice, float* out);

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_INITIALIZER_H_
