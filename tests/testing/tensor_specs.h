#ifndef ASYNCPS_TESTS_TESTING_TENSOR_SPECS_H_
#define ASYNCPS_TESTS_TESTING_TENSOR_SPECS_H_

// Tensor and optimizer specs that tests build over and over.

#include <cstdint>
#include <string>
#include <vector>

#include "proto/asyncps.pb.h"

namespace asyncps {
namespace testing {

inline OptimizerSpec SgdSpec(float learning_rate) {
  OptimizerSpec o;
  o.set_type(OPT_SGD);
  o.set_learning_rate(learning_rate);
  return o;
}

// An optimizer of `type` with every hyper-parameter set to a valid value
// (momentum 0.9, betas 0.9 / 0.999, initial accumulator 0.1), for tests that
// run each type.
inline OptimizerSpec AnyTypeSpec(OptimizerType type, float learning_rate,
                                 float epsilon) {
  OptimizerSpec o = SgdSpec(learning_rate);
  o.set_type(type);
  o.set_momentum(0.9f);
  o.set_beta1(0.9f);
  o.set_beta2(0.999f);
  o.set_epsilon(epsilon);
  o.set_initial_accumulator(0.1f);
  return o;
}

// A tensor of `shape` whose every element starts at `init_value`, cut into
// slices of `slice_elems`, trained with `optimizer`.
inline TensorSpec ConstantSpec(const std::string& name,
                               const std::vector<int64_t>& shape,
                               float init_value, const OptimizerSpec& optimizer,
                               int64_t slice_elems) {
  TensorSpec s;
  s.set_name(name);
  for (int64_t d : shape) s.add_shape(d);
  s.set_init(INIT_CONSTANT);
  s.set_init_value(init_value);
  *s.mutable_optimizer() = optimizer;
  s.set_slice_elems(slice_elems);
  return s;
}

// A sparse table of rows of `dim` floats, every row starting at `init`,
// trained with SGD at `learning_rate`.
inline TableSpec ConstantTableSpec(const std::string& name, int dim, float init,
                                   float learning_rate = 1.0f) {
  TableSpec t;
  t.set_name(name);
  t.set_dim(dim);
  t.set_init(INIT_CONSTANT);
  t.set_init_value(init);
  *t.mutable_optimizer() = SgdSpec(learning_rate);
  return t;
}

}  // namespace testing
}  // namespace asyncps

#endif  // ASYNCPS_TESTS_TESTING_TENSOR_SPECS_H_
