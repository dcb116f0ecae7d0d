#include "models/ctr_model.h"

#include <algorithm>
#include <cmath>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"

namespace asyncps {

namespace {

absl::Status Context(const absl::Status& s, absl::string_view what) {
  if (s.ok()) return s;
  return absl::Status(s.code(),
                      absl::StrCat("CtrModel ", what, ": ", s.message()));
}

}  // namespace

std::string CtrTableName(int field) { return absl::StrCat("ctr/emb", field); }

CtrModel::CtrModel(const CtrModelConfig& config, int max_batch,
                   Backend* backend)
    : config_(config), max_batch_(max_batch), backend_(backend) {
  const int f = config.fields, d = config.embedding_dim;
  if (config.dot_interactions) {
    for (int a = 0; a < f; ++a) {
      for (int b = a + 1; b < f; ++b) pairs_.emplace_back(a, b);
    }
  }
  layers_.push_back(config.dense_features + f * d +
                    static_cast<int>(pairs_.size()));
  for (int h : config.hidden) layers_.push_back(h);
  layers_.push_back(1);
  for (size_t l = 0; l + 1 < layers_.size(); ++l) {
    params_.push_back(
        {absl::StrCat("ctr/fc", l, "/w"), {layers_[l], layers_[l + 1]}, false});
    params_.push_back(
        {absl::StrCat("ctr/fc", l, "/b"), {layers_[l + 1]}, true});
  }
}

CtrModel::~CtrModel() = default;

absl::StatusOr<std::unique_ptr<CtrModel>> CtrModel::Create(
    const CtrModelConfig& config, int max_batch, Backend* backend) {
  if (backend == nullptr) {
    return absl::InvalidArgumentError("CtrModel needs a backend");
  }
  if (config.fields < 1 || config.dense_features < 0 ||
      config.embedding_dim < 1 || max_batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CtrModel: fields (", config.fields, "), embedding_dim (",
        config.embedding_dim, ") and max_batch (", max_batch,
        ") must be >= 1, dense_features (", config.dense_features, ") >= 0"));
  }
  for (int h : config.hidden) {
    if (h < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("CtrModel: hidden layer sizes must be >= 1, got ", h));
    }
  }
  std::unique_ptr<CtrModel> model =
      absl::WrapUnique(new CtrModel(config, max_batch, backend));
  absl::Status s = model->Allocate();
  if (!s.ok()) return s;
  return model;
}

absl::Status CtrModel::Allocate() {
  const size_t b = static_cast<size_t>(max_batch_);
  input_.resize(b * input_dim());
  dinput_.resize(b * input_dim());
  logits_.resize(b);
  auto add = [this](std::vector<DeviceBuffer>* to, size_t n,
                    const std::string& what) {
    absl::StatusOr<DeviceBuffer> buf = DeviceBuffer::Make(backend_, n);
    if (!buf.ok()) return Context(buf.status(), what);
    to->push_back(*std::move(buf));
    return absl::OkStatus();
  };
  for (const ParamInfo& p : params_) {
    absl::Status s = add(&param_bufs_, p.num_elements(), p.name);
    if (s.ok()) s = add(&grad_bufs_, p.num_elements(), p.name + " gradient");
    if (!s.ok()) return s;
  }
  for (size_t l = 0; l < layers_.size(); ++l) {
    absl::Status s = add(&act_, b * layers_[l], absl::StrCat("layer ", l));
    if (s.ok()) s = add(&delta_, b * layers_[l], absl::StrCat("delta ", l));
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CtrModel::BuildInput(const float* emb, const float* dense,
                                  int batch) {
  const int nf = config_.fields, d = config_.embedding_dim;
  const int nd = config_.dense_features;
  const int width = input_dim();
  // Example i's row of field f.
  auto row = [emb, batch, d](int f, int i) {
    return emb + (static_cast<size_t>(f) * batch + i) * d;
  };
  for (int i = 0; i < batch; ++i) {
    float* z = input_.data() + static_cast<size_t>(i) * width;
    std::copy_n(dense + static_cast<size_t>(i) * nd, nd, z);
    for (int f = 0; f < nf; ++f) std::copy_n(row(f, i), d, z + nd + f * d);
    float* dots = z + nd + nf * d;
    for (size_t p = 0; p < pairs_.size(); ++p) {
      const float* a = row(pairs_[p].first, i);
      const float* b = row(pairs_[p].second, i);
      float s = 0;
      for (int j = 0; j < d; ++j) s += a[j] * b[j];
      dots[p] = s;
    }
  }
  return Context(backend_->CopyToDevice(act_[0].data(), input_.data(),
                                        static_cast<size_t>(batch) * width),
                 "input upload");
}

absl::Status CtrModel::Upload(const std::vector<const float*>& params) {
  if (params.size() != params_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CtrModel expects ", params_.size(),
                     " parameter arrays, got ", params.size()));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("CtrModel parameter ", params_[i].name, " is null"));
    }
    absl::Status s = backend_->CopyToDevice(param_bufs_[i].data(), params[i],
                                            params_[i].num_elements());
    if (!s.ok()) return Context(s, params_[i].name);
  }
  return absl::OkStatus();
}

absl::Status CtrModel::Forward(int batch) {
  const size_t n = layers_.size() - 1;
  for (size_t l = 0; l < n; ++l) {
    const int in = layers_[l], out = layers_[l + 1];
    absl::Status s =
        backend_->Gemm(false, false, batch, out, in, 1.0f, act_[l].data(),
                       param_bufs_[2 * l].data(), 0.0f, act_[l + 1].data());
    if (s.ok()) {
      s = backend_->BiasActivation(act_[l + 1].data(),
                                   param_bufs_[2 * l + 1].data(), batch, out,
                                   /*relu=*/l + 1 < n);
    }
    if (!s.ok()) return Context(s, absl::StrCat("forward layer ", l));
  }
  return Context(backend_->CopyToHost(logits_.data(), act_.back().data(),
                                      static_cast<size_t>(batch)),
                 "logits download");
}

absl::Status CtrModel::Backward(int batch) {
  for (size_t l = layers_.size() - 1; l-- > 0;) {
    const int in = layers_[l], out = layers_[l + 1];
    const float* dy = delta_[l + 1].data();
    absl::Status s =
        backend_->Gemm(true, false, in, out, batch, 1.0f, act_[l].data(), dy,
                       0.0f, grad_bufs_[2 * l].data());
    if (s.ok()) {
      s = backend_->ColumnSum(dy, batch, out, grad_bufs_[2 * l + 1].data());
    }
    // The input's gradient too (it flows into the embeddings).
    if (s.ok()) {
      s = backend_->Gemm(false, true, batch, in, out, 1.0f, dy,
                         param_bufs_[2 * l].data(), 0.0f, delta_[l].data());
    }
    if (s.ok() && l > 0) {
      s = backend_->ReluBackward(delta_[l].data(), act_[l].data(),
                                 static_cast<size_t>(batch) * in);
    }
    if (!s.ok()) return Context(s, absl::StrCat("backward layer ", l));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> CtrModel::ComputeGradients(
    const std::vector<const float*>& params, const float* emb,
    const float* dense, const float* labels, int batch,
    const std::vector<float*>& grads, float* emb_grads) {
  if (batch < 1 || batch > max_batch_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CtrModel: batch ", batch, " is outside [1, ", max_batch_, "]"));
  }
  if (grads.size() != params_.size() || emb == nullptr || labels == nullptr ||
      emb_grads == nullptr ||
      (dense == nullptr && config_.dense_features > 0)) {
    return absl::InvalidArgumentError(
        "CtrModel: null inputs or a wrong number of gradient arrays");
  }
  absl::Status s = Upload(params);
  if (s.ok()) s = BuildInput(emb, dense, batch);
  if (s.ok()) s = Forward(batch);
  if (!s.ok()) return s;
  // Binary cross-entropy of sigmoid(logit), and its gradient per logit.
  double loss = 0;
  for (int i = 0; i < batch; ++i) {
    const double z = logits_[i];
    // log(1 + e^z) - y z, computed without overflow.
    loss +=
        std::max(z, 0.0) + std::log1p(std::exp(-std::abs(z))) - labels[i] * z;
    const double p = 1.0 / (1.0 + std::exp(-z));
    logits_[i] = static_cast<float>((p - labels[i]) / batch);
  }
  s = backend_->CopyToDevice(delta_.back().data(), logits_.data(), batch);
  if (s.ok()) s = Backward(batch);
  if (!s.ok()) return s;
  for (size_t i = 0; i < grads.size(); ++i) {
    s = backend_->CopyToHost(grads[i], grad_bufs_[i].data(),
                             params_[i].num_elements());
    if (!s.ok()) return Context(s, params_[i].name + " gradient download");
  }
  const int width = input_dim();
  s = backend_->CopyToHost(dinput_.data(), delta_[0].data(),
                           static_cast<size_t>(batch) * width);
  if (!s.ok()) return Context(s, "input gradient download");
  // Into the embeddings: their own slots, and through every dot product.
  const int nf = config_.fields, d = config_.embedding_dim;
  const int nd = config_.dense_features;
  auto offset = [batch, d](int f, int i) {
    return (static_cast<size_t>(f) * batch + i) * d;
  };
  for (int i = 0; i < batch; ++i) {
    const float* dz = dinput_.data() + static_cast<size_t>(i) * width;
    for (int f = 0; f < nf; ++f) {
      std::copy_n(dz + nd + f * d, d, emb_grads + offset(f, i));
    }
    const float* ddots = dz + nd + nf * d;
    for (size_t p = 0; p < pairs_.size(); ++p) {
      const size_t a = offset(pairs_[p].first, i);
      const size_t b = offset(pairs_[p].second, i);
      for (int j = 0; j < d; ++j) {
        emb_grads[a + j] += ddots[p] * emb[b + j];
        emb_grads[b + j] += ddots[p] * emb[a + j];
      }
    }
  }
  return loss / batch;
}

absl::Status CtrModel::Predict(const std::vector<const float*>& params,
                               const float* emb, const float* dense, int batch,
                               float* prob) {
  if (batch < 1 || batch > max_batch_ || emb == nullptr || prob == nullptr ||
      (dense == nullptr && config_.dense_features > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("CtrModel::Predict: batch ", batch, " outside [1, ",
                     max_batch_, "] or null inputs"));
  }
  absl::Status s = Upload(params);
  if (s.ok()) s = BuildInput(emb, dense, batch);
  if (s.ok()) s = Forward(batch);
  if (!s.ok()) return s;
  for (int i = 0; i < batch; ++i) {
    prob[i] = static_cast<float>(1.0 / (1.0 + std::exp(-logits_[i])));
  }
  return absl::OkStatus();
}

std::vector<TensorSpec> CtrDenseSpecs(const CtrModel& model,
                                      const OptimizerSpec& optimizer,
                                      uint64_t seed) {
  std::vector<TensorSpec> specs;
  for (const ParamInfo& p : model.params()) {
    TensorSpec t;
    t.set_name(p.name);
    for (int64_t d : p.shape) t.add_shape(d);
    t.set_init(p.is_bias ? INIT_ZEROS : INIT_GLOROT_UNIFORM);
    t.set_seed(seed);
    *t.mutable_optimizer() = optimizer;
    specs.push_back(std::move(t));
  }
  return specs;
}

}  // namespace asyncps
