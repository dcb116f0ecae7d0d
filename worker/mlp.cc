#include "worker/mlp.h"

#include <algorithm>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace asyncps {

int64_t ParamInfo::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<std::unique_ptr<Mlp>> Mlp::Create(std::vector<int> layer_sizes,
                                                 int max_batch,
                                                 Backend* backend) {
  if (backend == nullptr) {
    return absl::InvalidArgumentError("Mlp needs a backend, got null");
  }
  if (layer_sizes.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Mlp needs at least 2 layer sizes (input and classes), got ",
        layer_sizes.size()));
  }
  for (size_t i = 0; i < layer_sizes.size(); ++i) {
    if (layer_sizes[i] <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Mlp layer size ", i, " must be > 0, got ", layer_sizes[i]));
    }
  }
  if (max_batch <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Mlp max_batch must be > 0, got ", max_batch));
  }
  // The constructor is private, so std::make_unique cannot reach it.
  return absl::WrapUnique(new Mlp(std::move(layer_sizes), max_batch, backend));
}

Mlp::Mlp(std::vector<int> layer_sizes, int max_batch, Backend* backend)
    : layer_sizes_(std::move(layer_sizes)),
      max_batch_(max_batch),
      backend_(backend) {
  const int num_layers = static_cast<int>(layer_sizes_.size()) - 1;
  for (int l = 0; l < num_layers; ++l) {
    const int64_t in = layer_sizes_[l], out = layer_sizes_[l + 1];
    params_.push_back({absl::StrCat("fc", l, "/w"), {in, out}, false});
    params_.push_back({absl::StrCat("fc", l, "/b"), {out}, true});
  }
  for (const ParamInfo& p : params_) {
    param_bufs_.emplace_back(backend_, p.num_elements());
    grad_bufs_.emplace_back(backend_, p.num_elements());
  }
  for (int size : layer_sizes_) {
    activations_.emplace_back(backend_, static_cast<size_t>(max_batch_) * size);
    deltas_.emplace_back(backend_, static_cast<size_t>(max_batch_) * size);
  }
}

Mlp::~Mlp() = default;

absl::Status Mlp::CheckParams(const std::vector<const float*>& params) const {
  if (params.size() != params_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Mlp expects ", params_.size(), " parameter arrays, got ",
                     params.size()));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("Mlp parameter ", params_[i].name, " is null"));
    }
  }
  return absl::OkStatus();
}

absl::Status Mlp::CheckLabels(const int32_t* labels, int64_t n) const {
  for (int64_t i = 0; i < n; ++i) {
    if (labels[i] < 0 || labels[i] >= num_classes()) {
      return absl::InvalidArgumentError(
          absl::StrCat("label ", labels[i], " of example ", i,
                       " is outside [0, ", num_classes(), ")"));
    }
  }
  return absl::OkStatus();
}

void Mlp::UploadParams(const std::vector<const float*>& params) {
  for (size_t i = 0; i < params.size(); ++i) {
    backend_->CopyToDevice(param_bufs_[i].data(), params[i],
                           params_[i].num_elements());
  }
}

float* Mlp::Forward(const float* x, int batch) {
  backend_->CopyToDevice(activations_[0].data(), x,
                         static_cast<size_t>(batch) * input_dim());
  const int num_layers = static_cast<int>(layer_sizes_.size()) - 1;
  for (int l = 0; l < num_layers; ++l) {
    const int in = layer_sizes_[l], out = layer_sizes_[l + 1];
    float* y = activations_[l + 1].data();
    backend_->Gemm(false, false, batch, out, in, 1.0f, activations_[l].data(),
                   param_bufs_[2 * l].data(), 0.0f, y);
    backend_->BiasActivation(y, param_bufs_[2 * l + 1].data(), batch, out,
                             /*relu=*/l + 1 < num_layers);
  }
  return activations_.back().data();
}

absl::StatusOr<SoftmaxXentResult> Mlp::ComputeGradients(
    const std::vector<const float*>& params, const float* x,
    const int32_t* labels, int batch, const std::vector<float*>& grads) {
  if (batch <= 0 || batch > max_batch_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch size ", batch, " is outside [1, ", max_batch_, "]"));
  }
  if (x == nullptr || labels == nullptr) {
    return absl::InvalidArgumentError("Mlp inputs or labels are null");
  }
  absl::Status s = CheckParams(params);
  if (!s.ok()) return s;
  if (grads.size() != params_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Mlp expects ", params_.size(), " gradient arrays, got ",
                     grads.size()));
  }
  for (size_t i = 0; i < grads.size(); ++i) {
    if (grads[i] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("Mlp gradient for ", params_[i].name, " is null"));
    }
  }
  s = CheckLabels(labels, batch);
  if (!s.ok()) return s;

  UploadParams(params);
  const float* logits = Forward(x, batch);
  const int num_layers = static_cast<int>(layer_sizes_.size()) - 1;
  SoftmaxXentResult result = backend_->SoftmaxCrossEntropy(
      logits, labels, batch, num_classes(), deltas_[num_layers].data());

  for (int l = num_layers - 1; l >= 0; --l) {
    const int in = layer_sizes_[l], out = layer_sizes_[l + 1];
    const float* dy = deltas_[l + 1].data();
    // dW = X^T dY ([in, out]); db = column sums of dY.
    backend_->Gemm(true, false, in, out, batch, 1.0f, activations_[l].data(),
                   dy, 0.0f, grad_bufs_[2 * l].data());
    backend_->ColumnSum(dy, batch, out, grad_bufs_[2 * l + 1].data());
    if (l > 0) {
      // dX = dY W^T, then through the ReLU that produced X.
      float* dx = deltas_[l].data();
      backend_->Gemm(false, true, batch, in, out, 1.0f, dy,
                     param_bufs_[2 * l].data(), 0.0f, dx);
      backend_->ReluBackward(dx, activations_[l].data(),
                             static_cast<size_t>(batch) * in);
    }
  }
  for (size_t i = 0; i < grads.size(); ++i) {
    backend_->CopyToHost(grads[i], grad_bufs_[i].data(),
                         params_[i].num_elements());
  }
  return result;
}

absl::StatusOr<SoftmaxXentResult> Mlp::Evaluate(
    const std::vector<const float*>& params, const float* x,
    const int32_t* labels, int64_t n) {
  if (n <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Mlp::Evaluate needs n >= 1, got ", n));
  }
  if (x == nullptr || labels == nullptr) {
    return absl::InvalidArgumentError("Mlp inputs or labels are null");
  }
  absl::Status s = CheckParams(params);
  if (!s.ok()) return s;
  s = CheckLabels(labels, n);
  if (!s.ok()) return s;

  UploadParams(params);
  double loss_sum = 0.0;
  SoftmaxXentResult total;
  for (int64_t start = 0; start < n; start += max_batch_) {
    const int batch =
        static_cast<int>(std::min<int64_t>(max_batch_, n - start));
    const float* logits =
        Forward(x + start * static_cast<int64_t>(input_dim()), batch);
    SoftmaxXentResult r = backend_->SoftmaxCrossEntropy(
        logits, labels + start, batch, num_classes(), /*dlogits=*/nullptr);
    loss_sum += r.mean_loss * batch;
    total.correct += r.correct;
  }
  total.mean_loss = loss_sum / static_cast<double>(n);
  return total;
}

absl::StatusOr<std::vector<int>> ParseLayerSizes(absl::string_view hidden,
                                                 int input, int classes) {
  if (input <= 0 || classes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("input size (", input,
                                                   ") and class count (",
                                                   classes, ") must be > 0"));
  }
  std::vector<int> sizes = {input};
  if (!absl::StripAsciiWhitespace(hidden).empty()) {
    for (absl::string_view part : absl::StrSplit(hidden, ',')) {
      part = absl::StripAsciiWhitespace(part);
      int v = 0;
      if (!absl::SimpleAtoi(part, &v) || v <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("hidden layer size \"", part, "\" in \"", hidden,
                         "\" is not a positive integer"));
      }
      sizes.push_back(v);
    }
  }
  sizes.push_back(classes);
  return sizes;
}

}  // namespace asyncps
