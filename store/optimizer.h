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
// [0, 1); epsilon > 0 for Adam and Adagrad; initial_accumulator >= 0 for
// Adagrad; no schedule (store/lr_schedule.h: a created spec has none). The
// message names the field.
absl::Status ValidateOptimizer(const OptimizerSpec& spec);

// Optimizer state buffers a slice of this optimizer keeps, each as long as
// the slice: 0 (SGD), 1 (momentum, Adagrad), 2 (Adam).
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
  // (SGD), the velocity (momentum), the accumulator (Adagrad), the first and
  // second moments (Adam).
  // Checkpoints save and restore them; together with the slice's values and
  // version they determine every later update exactly.
  virtual std::vector<absl::Span<const float>> state() const = 0;
  virtual std::vector<absl::Span<float>> mutable_state() = 0;
};

// The update rule of the rows of a sparse table (store/sparse_table.h),
// whose state lives next to each row's values rather than in the updater:
// OptimizerBuffers(spec) buffers of dim floats per row, in the order of
// SliceOptimizer::state(). The arithmetic is the slices' (the same loops);
// Adam is "lazy" here: only the rows a push touches are updated, with bias
// correction by the row's own update count.
//
// Thread-safe (immutable); the caller serializes updates of one row.
class RowUpdater {
 public:
  // REQUIRES: ValidateOptimizer(spec).ok(), dim > 0.
  RowUpdater(const OptimizerSpec& spec, int dim);

  // Floats of state per row.
  int state_floats() const { return buffers_ * dim_; }

  // The state of a new row: zeros, the accumulator at initial_accumulator
  // for Adagrad.
  void InitState(float* state) const;

  // Applies gradient g[0, dim) to row w[0, dim) with its state, learning
  // rate spec.learning_rate * lr_scale; `step` is the row's 1-based update
  // count. REQUIRES: every g finite.
  void Apply(float* w, float* state, const float* g, float lr_scale,
             uint64_t step) const;

 private:
  const OptimizerType type_;
  const int dim_;
  const float lr_, momentum_, beta1_, beta2_, epsilon_, initial_accumulator_;
  const int buffers_;
};

}  // namespace asyncps

#endif  // ASYNCPS_STORE_OPTIMIZER_H_
