#ifndef ASYNCPS_STORE_OPTIMIZER_H_
#define ASYNCPS_STORE_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/payload.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

// Checks hyper-parameters: learning_rate > 0; momentum, beta1, beta2 in
// [0, 1); epsilon > 0 for Adam. The message names the field.
absl::Status ValidateOptimizer(const OptimizerSpec& spec);

// Optimizer state buffers a slice of this optimizer keeps, each as long as
// the slice: 0 (SGD), 1 (momentum), 2 (Adam).
int OptimizerBuffers(const OptimizerSpec& spec);

// The update rule of one slice together with its state (momentum buffer,
// Adam moments). Not thread-safe: the owner serializes calls (the slice
// lock).
class SliceOptimizer {
 public:
  // REQUIRES: ValidateOptimizer(spec).ok().
  static std::unique_ptr<SliceOptimizer> Create(const OptimizerSpec& spec,
                                                size_t n);
  virtual ~SliceOptimizer() = default;

  // Applies gradient `g` (n values, in its wire encoding, read in place
  // from its pieces: one pass over g and the state) to weights w[0, n) with
  // learning rate spec.learning_rate * lr_scale. `step` is the 1-based
  // number of this update of the slice (Adam's bias correction).
  // REQUIRES: g.count() == n, every value of g finite.
  virtual void Apply(float* w, const Payload& g, float lr_scale,
                     uint64_t step) = 0;

  // Bytes of optimizer state held.
  virtual size_t state_bytes() const = 0;

  // The state buffers, each as long as the slice, in a fixed order: none
  // (SGD), the velocity (momentum), the first and second moments (Adam).
  // Checkpoints save and restore them; together with the slice's values and
  // version they determine every later update exactly.
  virtual std::vector<absl::Span<const float>> state() const = 0;
  virtual std::vector<absl::Span<float>> mutable_state() = 0;
};

}  // namespace asyncps

#endif  // ASYNCPS_STORE_OPTIMIZER_H_
