#include "models/mlp.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace asyncps {

namespace {

// `s` with "<context>: " in front of its message; OK stays OK.
absl::Status Annotate(const absl::Status& s, absl::string_view context) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(context, ": ", s.message()));
}

}  // namespace

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
  std::unique_ptr<Mlp> mlp =
      absl::WrapUnique(new Mlp(std::move(layer_sizes), max_batch, backend));
  absl::Status s = mlp->AllocateBuffers();
  if (!s.ok()) return s;
  return mlp;
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
}

absl::Status Mlp::AllocateBuffers() {
  // Appends a buffer of n floats to `to`; `what` names it in errors.
  auto add = [this](std::vector<DeviceBuffer>& to, int64_t n,
                    absl::string_view what) {
    absl::StatusOr<DeviceBuffer> buf =
        DeviceBuffer::Make(backend_, static_cast<size_t>(n));
    if (!buf.ok()) return Annotate(buf.status(), absl::StrCat("Mlp ", what));
    to.push_back(*std::move(buf));
    return absl::OkStatus();
  };
  for (const ParamInfo& p : params_) {
    absl::Status s = add(param_bufs_, p.num_elements(), p.name);
    if (s.ok()) s = add(grad_bufs_, p.num_elements(), p.name + " gradient");
    if (!s.ok()) return s;
  }
  for (size_t l = 0; l < layer_sizes_.size(); ++l) {
    const int64_t n = int64_t{max_batch_} * layer_sizes_[l];
    absl::Status s = add(activations_, n, absl::StrCat("activations ", l));
    if (s.ok()) s = add(deltas_, n, absl::StrCat("deltas ", l));
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
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

absl::Status Mlp::UploadParams(const std::vector<const float*>& params) {
  for (size_t i = 0; i < params.size(); ++i) {
    absl::Status s = backend_->CopyToDevice(param_bufs_[i].data(), params[i],
                                            params_[i].num_elements());
    if (!s.ok()) {
      return Annotate(s, absl::StrCat("Mlp upload of ", params_[i].name));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<float*> Mlp::Forward(const float* x, int batch) {
  absl::Status s = backend_->CopyToDevice(
      activations_[0].data(), x, static_cast<size_t>(batch) * input_dim());
  if (!s.ok()) return Annotate(s, "Mlp input upload");
  const int num_layers = static_cast<int>(layer_sizes_.size()) - 1;
  for (int l = 0; l < num_layers; ++l) {
    const int in = layer_sizes_[l], out = layer_sizes_[l + 1];
    float* y = activations_[l + 1].data();
    s = backend_->Gemm(false, false, batch, out, in, 1.0f,
                       activations_[l].data(), param_bufs_[2 * l].data(), 0.0f,
                       y);
    if (s.ok()) {
      s = backend_->BiasActivation(y, param_bufs_[2 * l + 1].data(), batch, out,
                                   /*relu=*/l + 1 < num_layers);
    }
    if (!s.ok()) return Annotate(s, absl::StrCat("Mlp forward layer ", l));
  }
  return activations_.back().data();
}

absl::Status Mlp::Backward(int batch) {
  const int num_layers = static_cast<int>(layer_sizes_.size()) - 1;
  for (int l = num_layers - 1; l >= 0; --l) {
    const int in = layer_sizes_[l], out = layer_sizes_[l + 1];
    const float* dy = deltas_[l + 1].data();
    // dW = X^T dY ([in, out]); db = column sums of dY.
    absl::Status s = backend_->Gemm(true, false, in, out, batch, 1.0f,
                                    activations_[l].data(), dy, 0.0f,
                                    grad_bufs_[2 * l].data());
    if (s.ok()) {
      s = backend_->ColumnSum(dy, batch, out, grad_bufs_[2 * l + 1].data());
    }
    if (s.ok() && l > 0) {
      // dX = dY W^T, then through the ReLU that produced X.
      float* dx = deltas_[l].data();
      s = backend_->Gemm(false, true, batch, in, out, 1.0f, dy,
                         param_bufs_[2 * l].data(), 0.0f, dx);
      if (s.ok()) {
        s = backend_->ReluBackward(dx, activations_[l].data(),
                                   static_cast<size_t>(batch) * in);
      }
    }
    if (!s.ok()) return Annotate(s, absl::StrCat("Mlp backward layer ", l));
  }
  return absl::OkStatus();
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

  s = UploadParams(params);
  if (!s.ok()) return s;
  absl::StatusOr<float*> logits = Forward(x, batch);
  if (!logits.ok()) return logits.status();
  absl::StatusOr<SoftmaxXentResult> result = backend_->SoftmaxCrossEntropy(
      *logits, labels, batch, num_classes(), deltas_.back().data());
  if (!result.ok()) return Annotate(result.status(), "Mlp loss");
  s = Backward(batch);
  if (!s.ok()) return s;
  for (size_t i = 0; i < grads.size(); ++i) {
    s = backend_->CopyToHost(grads[i], grad_bufs_[i].data(),
                             params_[i].num_elements());
    if (!s.ok()) {
      return Annotate(
          s, absl::StrCat("Mlp download of ", params_[i].name, " gradient"));
    }
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

  s = UploadParams(params);
  if (!s.ok()) return s;
  double loss_sum = 0.0;
  SoftmaxXentResult total;
  for (int64_t start = 0; start < n; start += max_batch_) {
    const int batch =
        static_cast<int>(std::min<int64_t>(max_batch_, n - start));
    absl::StatusOr<float*> logits =
        Forward(x + start * static_cast<int64_t>(input_dim()), batch);
    if (!logits.ok()) return logits.status();
    absl::StatusOr<SoftmaxXentResult> r = backend_->SoftmaxCrossEntropy(
        *logits, labels + start, batch, num_classes(), /*dlogits=*/nullptr);
    if (!r.ok()) return Annotate(r.status(), "Mlp loss");
    loss_sum += r->mean_loss * batch;
    total.correct += r->correct;
  }
  total.mean_loss = loss_sum / static_cast<double>(n);
  return total;
}

absl::Status Mlp::LoadParams(const std::vector<const float*>& params) {
  params_loaded_ = false;
  absl::Status s = CheckParams(params);
  if (s.ok()) s = UploadParams(params);
  if (!s.ok()) return s;
  params_loaded_ = true;
  return absl::OkStatus();
}

absl::Status Mlp::Predict(const float* x, int batch, float* probs) {
  if (batch < 1 || batch > max_batch_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Mlp::Predict batch must be in [1, ", max_batch_, "], got ", batch));
  }
  if (x == nullptr || probs == nullptr) {
    return absl::InvalidArgumentError(
        "Mlp::Predict inputs or outputs are null");
  }
  if (!params_loaded_) {
    return absl::FailedPreconditionError(
        "Mlp::Predict before LoadParams: no parameters on the backend");
  }
  absl::StatusOr<float*> logits = Forward(x, batch);
  if (!logits.ok()) return logits.status();
  const int classes = num_classes();
  absl::Status s = backend_->CopyToHost(probs, *logits,
                                        static_cast<size_t>(batch) * classes);
  if (!s.ok()) return Annotate(s, "Mlp logits download");
  for (int r = 0; r < batch; ++r) {
    float* row = probs + static_cast<int64_t>(r) * classes;
    const float top = *std::max_element(row, row + classes);
    double sum = 0;
    for (int c = 0; c < classes; ++c) {
      row[c] = std::exp(row[c] - top);
      sum += row[c];
    }
    for (int c = 0; c < classes; ++c) {
      row[c] = static_cast<float>(row[c] / sum);
    }
  }
  return absl::OkStatus();
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

std::vector<TensorSpec> MlpSpecs(const std::vector<int>& layer_sizes,
                                 const OptimizerSpec& optimizer,
                                 uint64_t seed) {
  std::vector<TensorSpec> specs;
  for (size_t l = 0; l + 1 < layer_sizes.size(); ++l) {
    TensorSpec w;
    w.set_name(absl::StrCat("fc", l, "/w"));
    w.add_shape(layer_sizes[l]);
    w.add_shape(layer_sizes[l + 1]);
    w.set_init(INIT_GLOROT_UNIFORM);
    w.set_seed(seed);
    *w.mutable_optimizer() = optimizer;
    specs.push_back(w);
    TensorSpec b;
    b.set_name(absl::StrCat("fc", l, "/b"));
    b.add_shape(layer_sizes[l + 1]);
    b.set_init(INIT_ZEROS);
    b.set_seed(seed);
    *b.mutable_optimizer() = optimizer;
    specs.push_back(b);
  }
  return specs;
}

}  // namespace asyncps
