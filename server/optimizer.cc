#include "server/optimizer.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"

namespace asyncps {
namespace {

bool InUnitInterval(float x) { return std::isfinite(x) && x >= 0 && x < 1; }

// w -= lr * g
class Sgd : public SliceOptimizer {
 public:
  explicit Sgd(const OptimizerSpec& spec) : lr_(spec.learning_rate()) {}
  void Apply(float* w, const float* g, size_t n, float lr_scale,
             uint64_t /*step*/) override {
    const float lr = lr_ * lr_scale;
    for (size_t i = 0; i < n; ++i) w[i] -= lr * g[i];
  }
  size_t state_bytes() const override { return 0; }
  std::vector<absl::Span<const float>> state() const override { return {}; }
  std::vector<absl::Span<float>> mutable_state() override { return {}; }

 private:
  const float lr_;
};

// v = mu * v + g; w -= lr * v   (the heavy-ball form used by PyTorch).
class Momentum : public SliceOptimizer {
 public:
  Momentum(const OptimizerSpec& spec, size_t n)
      : lr_(spec.learning_rate()), mu_(spec.momentum()), v_(n, 0.0f) {}
  void Apply(float* w, const float* g, size_t n, float lr_scale,
             uint64_t /*step*/) override {
    const float lr = lr_ * lr_scale;
    float* v = v_.data();
    for (size_t i = 0; i < n; ++i) {
      v[i] = mu_ * v[i] + g[i];
      w[i] -= lr * v[i];
    }
  }
  size_t state_bytes() const override { return v_.size() * sizeof(float); }
  std::vector<absl::Span<const float>> state() const override {
    return {absl::MakeConstSpan(v_)};
  }
  std::vector<absl::Span<float>> mutable_state() override {
    return {absl::MakeSpan(v_)};
  }

 private:
  const float lr_;
  const float mu_;
  std::vector<float> v_;
};

// Kingma & Ba (2015), with bias correction by the slice's update count.
class Adam : public SliceOptimizer {
 public:
  Adam(const OptimizerSpec& spec, size_t n)
      : lr_(spec.learning_rate()),
        b1_(spec.beta1()),
        b2_(spec.beta2()),
        eps_(spec.epsilon()),
        m_(n, 0.0f),
        v_(n, 0.0f) {}
  void Apply(float* w, const float* g, size_t n, float lr_scale,
             uint64_t step) override {
    const double t = static_cast<double>(step);
    const float c1 = static_cast<float>(1.0 / (1.0 - std::pow(b1_, t)));
    const float c2 = static_cast<float>(1.0 / (1.0 - std::pow(b2_, t)));
    const float lr = lr_ * lr_scale;
    float* m = m_.data();
    float* v = v_.data();
    for (size_t i = 0; i < n; ++i) {
      m[i] = b1_ * m[i] + (1 - b1_) * g[i];
      v[i] = b2_ * v[i] + (1 - b2_) * g[i] * g[i];
      w[i] -= lr * (m[i] * c1) / (std::sqrt(v[i] * c2) + eps_);
    }
  }
  size_t state_bytes() const override {
    return (m_.size() + v_.size()) * sizeof(float);
  }
  std::vector<absl::Span<const float>> state() const override {
    return {absl::MakeConstSpan(m_), absl::MakeConstSpan(v_)};
  }
  std::vector<absl::Span<float>> mutable_state() override {
    return {absl::MakeSpan(m_), absl::MakeSpan(v_)};
  }

 private:
  const float lr_, b1_, b2_, eps_;
  std::vector<float> m_, v_;
};

}  // namespace

absl::Status ValidateOptimizer(const OptimizerSpec& spec) {
  if (!std::isfinite(spec.learning_rate()) || spec.learning_rate() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer.learning_rate must be > 0, got ", spec.learning_rate()));
  }
  switch (spec.type()) {
    case OPT_SGD:
      return absl::OkStatus();
    case OPT_MOMENTUM:
      if (!InUnitInterval(spec.momentum())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "optimizer.momentum must be in [0, 1), got ", spec.momentum()));
      }
      return absl::OkStatus();
    case OPT_ADAM:
      if (!InUnitInterval(spec.beta1())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "optimizer.beta1 must be in [0, 1), got ", spec.beta1()));
      }
      if (!InUnitInterval(spec.beta2())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "optimizer.beta2 must be in [0, 1), got ", spec.beta2()));
      }
      if (!std::isfinite(spec.epsilon()) || spec.epsilon() <= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "optimizer.epsilon must be > 0, got ", spec.epsilon()));
      }
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer.type ", spec.type(), " is unknown"));
  }
}

std::unique_ptr<SliceOptimizer> SliceOptimizer::Create(
    const OptimizerSpec& spec, size_t n) {
  switch (spec.type()) {
    case OPT_MOMENTUM:
      return std::make_unique<Momentum>(spec, n);
    case OPT_ADAM:
      return std::make_unique<Adam>(spec, n);
    case OPT_SGD:
    default:
      return std::make_unique<Sgd>(spec);
  }
}

}  // namespace asyncps
