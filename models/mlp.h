#ifndef ASYNCPS_MODELS_MLP_H_
#define ASYNCPS_MODELS_MLP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/backend.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

// One named dense parameter tensor of a model, as stored on the parameter
// server.
struct ParamInfo {
  std::string name;            // "fc<i>/w" or "fc<i>/b", i from 0
  std::vector<int64_t> shape;  // [in, out] for weights, [out] for biases
  bool is_bias = false;
  int64_t num_elements() const;
};

// A multilayer perceptron for classification: fully connected layers
// Y = X W + b (W is [in, out], row-major), ReLU after every hidden layer, and
// softmax cross-entropy on the last. layer_sizes {784, 10} is softmax
// regression; {784, 256, 128, 10} has two hidden layers.
//
// The parameters live outside the model (they come from the parameter
// server): every call takes host arrays, one per params() entry, copies them
// to the backend and runs there. Activation buffers for max_batch rows are
// allocated once, at Create.
//
// Not thread-safe (it owns scratch buffers and drives one Backend); use one
// Mlp per training thread.
class Mlp {
 public:
  // INVALID_ARGUMENT unless there are >= 2 layer sizes, all > 0, max_batch
  // > 0 and backend is not null; the backend's error (RESOURCE_EXHAUSTED,
  // ...) when the parameter and activation buffers cannot be allocated.
  // `backend` is not owned and must outlive the Mlp.
  static absl::StatusOr<std::unique_ptr<Mlp>> Create(
      std::vector<int> layer_sizes, int max_batch, Backend* backend);

  Mlp(const Mlp&) = delete;
  Mlp& operator=(const Mlp&) = delete;
  ~Mlp();

  // fc0/w, fc0/b, fc1/w, fc1/b, ... in this order; fixed for the model's
  // lifetime.
  const std::vector<ParamInfo>& params() const { return params_; }
  const std::vector<int>& layer_sizes() const { return layer_sizes_; }
  int input_dim() const { return layer_sizes_.front(); }
  int num_classes() const { return layer_sizes_.back(); }
  int max_batch() const { return max_batch_; }

  // Forward and backward pass over one minibatch. params[i] and grads[i] are
  // host arrays of params()[i].num_elements() floats; x is batch x
  // input_dim() row-major, labels has batch entries in [0, num_classes()).
  // grads receive d(mean loss over the batch)/d(param). Returns the batch's
  // mean loss and number of correct predictions.
  // INVALID_ARGUMENT for a batch outside [1, max_batch()], wrong vector
  // sizes, null pointers or an out-of-range label (grads untouched then).
  // A failing backend operation returns its error, prefixed with what the
  // Mlp was doing ("Mlp forward layer 1: Gemm: cublasSgemm: ..."); grads
  // are unspecified then.
  absl::StatusOr<SoftmaxXentResult> ComputeGradients(
      const std::vector<const float*>& params, const float* x,
      const int32_t* labels, int batch, const std::vector<float*>& grads);

  // Loss and accuracy over n examples (any n >= 1; processed in chunks of
  // max_batch()). mean_loss is the mean over all n examples, correct the
  // total count. Errors as for ComputeGradients.
  absl::StatusOr<SoftmaxXentResult> Evaluate(
      const std::vector<const float*>& params, const float* x,
      const int32_t* labels, int64_t n);

  // Inference (ps_serve): LoadParams copies the parameters to the backend
  // once; Predict then writes the class probabilities (softmax of the
  // logits) of `batch` rows of x, batch x num_classes() floats, into host
  // memory `probs`, with the parameters last loaded. INVALID_ARGUMENT for a
  // batch outside [1, max_batch()], null pointers or wrong vector sizes;
  // FAILED_PRECONDITION from Predict before any LoadParams.
  absl::Status LoadParams(const std::vector<const float*>& params);
  absl::Status Predict(const float* x, int batch, float* probs);

 private:
  Mlp(std::vector<int> layer_sizes, int max_batch, Backend* backend);

  // Allocates the device buffers; called once by Create.
  absl::Status AllocateBuffers();
  absl::Status CheckParams(const std::vector<const float*>& params) const;
  absl::Status CheckLabels(const int32_t* labels, int64_t n) const;
  // Copies all parameters to the device.
  absl::Status UploadParams(const std::vector<const float*>& params);
  // Uploads x (batch rows) and fills activations_; returns the logits.
  absl::StatusOr<float*> Forward(const float* x, int batch);
  // Backpropagates deltas_.back() (d loss / d logits) of `batch` rows into
  // grad_bufs_.
  absl::Status Backward(int batch);

  // Const after construction.
  const std::vector<int> layer_sizes_;
  const int max_batch_;
  Backend* const backend_;  // Not owned.
  std::vector<ParamInfo> params_;

  // Device scratch, sized for max_batch_ rows by AllocateBuffers.
  std::vector<DeviceBuffer> param_bufs_;   // one per params_ entry
  std::vector<DeviceBuffer> grad_bufs_;    // one per params_ entry
  std::vector<DeviceBuffer> activations_;  // [0] input, [l] layer l output
  std::vector<DeviceBuffer> deltas_;       // [l] d loss / d activations_[l]
  bool params_loaded_ = false;  // by LoadParams (Predict's parameters)
};

// Layer sizes from a hidden-layer list: "256,128" with input 784 and 10
// classes gives {784, 256, 128, 10}; "" gives softmax regression {784, 10}.
// INVALID_ARGUMENT (naming the bad entry) unless every entry is a positive
// integer and input, classes > 0. Whitespace around entries is ignored.
absl::StatusOr<std::vector<int>> ParseLayerSizes(absl::string_view hidden,
                                                 int input, int classes);

// The parameter tensors of the MLP with `layer_sizes` (the names and shapes
// of Mlp::params()): glorot-uniform weights, zero biases, all with
// `optimizer` and `seed`.
std::vector<TensorSpec> MlpSpecs(const std::vector<int>& layer_sizes,
                                 const OptimizerSpec& optimizer, uint64_t seed);

}  // namespace asyncps

#endif  // ASYNCPS_MODELS_MLP_H_
