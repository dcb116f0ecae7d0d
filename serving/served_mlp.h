#ifndef ASYNCPS_SERVING_SERVED_MLP_H_
#define ASYNCPS_SERVING_SERVED_MLP_H_

// The Fashion-MNIST MLP ps_worker trains (models/mlp.h), for inference.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "models/mlp.h"
#include "proto/asyncps.pb.h"
#include "serving/batcher.h"

namespace asyncps {

// The layer sizes of the MLP whose tensors are `specs`: fc0/w [in, h1],
// fc0/b [h1], fc1/w [h1, h2], ... as ps_worker creates them.
// FAILED_PRECONDITION (naming what is missing or inconsistent) when the
// specs hold no such chain.
absl::StatusOr<std::vector<int>> MlpLayersFromSpecs(
    const std::vector<TensorSpec>& specs);

// One batch thread's MLP: its own backend and activation buffers; the
// parameters are uploaded once per snapshot. Not thread-safe.
class MlpRunner : public BatchRunner {
 public:
  // `device` as MakeBackend ("cpu", "cuda", "auto").
  static absl::StatusOr<std::unique_ptr<MlpRunner>> Create(
      const std::vector<int>& layer_sizes, int max_batch,
      const std::string& device);

  absl::Status Run(const Snapshot& snapshot, const float* x,
                   const uint64_t* ids, int rows, float* out) override;

 private:
  MlpRunner(std::unique_ptr<Backend> backend, std::unique_ptr<Mlp> mlp)
      : backend_(std::move(backend)), mlp_(std::move(mlp)) {}

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Mlp> mlp_;
  uint64_t loaded_ = 0;  // the snapshot whose parameters are uploaded
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVING_SERVED_MLP_H_
