#ifndef ASYNCPS_MODELS_CTR_MODEL_H_
#define ASYNCPS_MODELS_CTR_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "models/mlp.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

struct CtrModelConfig {
  int fields = 8;  // categorical fields, one embedding table each
  int dense_features = 4;
  int embedding_dim = 16;
  std::vector<int> hidden = {64, 32};  // the top MLP's hidden layers
  // DLRM's interaction: the dot products of every pair of field embeddings
  // join the MLP's input.
  bool dot_interactions = true;
};

// A click-through-rate model in the style of DLRM (Naumov et al. 2019):
// every categorical field's id is looked up in its embedding table (the
// sparse tables of the parameter server; the rows come in from outside),
// and the MLP's input is
//   [dense features | the F embeddings | <e_f, e_g> for every f < g]
// followed by ReLU layers and one logit; the loss is the binary
// cross-entropy of sigmoid(logit). The MLP's weights are dense tensors
// "ctr/fc<l>/w" ([in, out]) and "ctr/fc<l>/b" held outside too (host
// arrays, one per params() entry), and it runs on a kernels Backend.
//
// Not thread-safe (scratch buffers, one Backend).
class CtrModel {
 public:
  // INVALID_ARGUMENT for sizes < 1 (hidden layers may be none); the
  // backend's error when buffers cannot be allocated. `backend` is not
  // owned and must outlive the model.
  static absl::StatusOr<std::unique_ptr<CtrModel>> Create(
      const CtrModelConfig& config, int max_batch, Backend* backend);
  ~CtrModel();
  CtrModel(const CtrModel&) = delete;
  CtrModel& operator=(const CtrModel&) = delete;

  const CtrModelConfig& config() const { return config_; }
  const std::vector<ParamInfo>& params() const { return params_; }
  // Width of the MLP's input.
  int input_dim() const { return layers_.front(); }
  int max_batch() const { return max_batch_; }

  // One minibatch: emb holds fields x batch x embedding_dim values, field
  // by field (example i's row of field f at (f * batch + i) *
  // embedding_dim: each field's block is what its table's pull returns),
  // dense batch x dense_features, labels batch values in {0, 1}. Writes
  // d(mean loss)/d param into grads (one host array per params() entry) and
  // d(mean loss)/d emb into emb_grads (laid out as emb). Returns the mean
  // loss.
  absl::StatusOr<double> ComputeGradients(
      const std::vector<const float*>& params, const float* emb,
      const float* dense, const float* labels, int batch,
      const std::vector<float*>& grads, float* emb_grads);

  // Click probabilities of a minibatch into prob[0, batch).
  absl::Status Predict(const std::vector<const float*>& params,
                       const float* emb, const float* dense, int batch,
                       float* prob);

 private:
  CtrModel(const CtrModelConfig& config, int max_batch, Backend* backend);
  absl::Status Allocate();
  // The MLP input of a batch into input_ (host), then to the device.
  absl::Status BuildInput(const float* emb, const float* dense, int batch);
  absl::Status Upload(const std::vector<const float*>& params);
  // The logits of the batch in input_, on the host in logits_.
  absl::Status Forward(int batch);
  absl::Status Backward(int batch);

  const CtrModelConfig config_;
  const int max_batch_;
  Backend* const backend_;   // Not owned.
  std::vector<int> layers_;  // input, hidden..., 1
  std::vector<ParamInfo> params_;
  // Pairs (f, g), f < g, in the order of the input's dot features.
  std::vector<std::pair<int, int>> pairs_;

  std::vector<float> input_;   // host: batch x input_dim
  std::vector<float> logits_;  // host: batch
  std::vector<float> dinput_;  // host: d loss / d input

  std::vector<DeviceBuffer> param_bufs_, grad_bufs_;
  std::vector<DeviceBuffer> act_;    // [0] input, [l] layer l's output
  std::vector<DeviceBuffer> delta_;  // [l] d loss / d act_[l]
};

// The dense tensors of the model with `optimizer` and `seed`: glorot-uniform
// weights, zero biases.
std::vector<TensorSpec> CtrDenseSpecs(const CtrModel& model,
                                      const OptimizerSpec& optimizer,
                                      uint64_t seed);

// The name of field f's embedding table: "ctr/emb<f>".
std::string CtrTableName(int field);

}  // namespace asyncps

#endif  // ASYNCPS_MODELS_CTR_MODEL_H_
