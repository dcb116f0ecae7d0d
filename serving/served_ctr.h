#ifndef ASYNCPS_SERVING_SERVED_CTR_H_
#define ASYNCPS_SERVING_SERVED_CTR_H_

// The DLRM-like click model ps_worker --model=ctr trains (models/ctr_model.h),
// for inference: dense weights from the snapshot, embedding rows per batch
// through a RowCache.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "models/ctr_model.h"
#include "proto/asyncps.pb.h"
#include "serving/batcher.h"
#include "serving/row_cache.h"

namespace asyncps {

// The model's configuration from the cluster's specs: one table
// ctr/emb<f> per field (all of one dim), the MLP ctr/fc<l>/{w,b} ending in
// one logit; the dense feature count follows from the MLP's input width
// (with DLRM's pairwise dot products, as ps_worker trains it).
// FAILED_PRECONDITION naming what is missing or inconsistent.
absl::StatusOr<CtrModelConfig> CtrConfigFromSpecs(
    const ListTensorsResponse& specs);

// The dense tensors of `config`'s model, in CtrModel::params() order.
std::vector<std::string> CtrDenseNames(const CtrModelConfig& config);

// One batch thread's model: x holds rows x dense_features, ids rows x
// fields (the id of every field of a row), out rows x 1 click
// probabilities. Not thread-safe; the RowCache is shared.
class CtrRunner : public BatchRunner {
 public:
  // `rows` is not owned and must outlive the runner.
  static absl::StatusOr<std::unique_ptr<CtrRunner>> Create(
      const CtrModelConfig& config, int max_batch, const std::string& device,
      RowCache* rows);

  absl::Status Run(const Snapshot& snapshot, const float* x,
                   const uint64_t* ids, int rows, float* out) override;

 private:
  CtrRunner(std::unique_ptr<Backend> backend, std::unique_ptr<CtrModel> model,
            RowCache* rows)
      : backend_(std::move(backend)), model_(std::move(model)), rows_(rows) {}

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<CtrModel> model_;
  RowCache* const rows_;
  std::vector<float> emb_;           // fields x rows x dim
  std::vector<uint64_t> field_ids_;  // one field's ids of the batch
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVING_SERVED_CTR_H_
