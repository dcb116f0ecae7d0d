// The click model's gradients (dense tensors and embeddings, through the
// dot interactions) agree with finite differences, and it learns a simple
// rule.
#include "models/ctr_model.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/backend.h"

namespace asyncps {
namespace {

struct Params {
  explicit Params(const CtrModel& m, uint64_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.0f, 0.3f);
    for (const ParamInfo& p : m.params()) {
      values.emplace_back(p.num_elements());
      for (float& v : values.back()) v = n(rng);
    }
  }
  std::vector<const float*> Reads() const {
    std::vector<const float*> out;
    for (const auto& v : values) out.push_back(v.data());
    return out;
  }
  std::vector<float*> Writes() {
    std::vector<float*> out;
    for (auto& v : values) out.push_back(v.data());
    return out;
  }
  std::vector<std::vector<float>> values;
};

TEST_CASE("CtrModel gradients match finite differences", "[ctr][model]") {
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  CtrModelConfig config;
  config.fields = 3;
  config.dense_features = 2;
  config.embedding_dim = 4;
  config.hidden = {5};
  const int batch = 4;
  auto model = CtrModel::Create(config, batch, cpu.get());
  REQUIRE(model.ok());
  CtrModel& m = **model;
  REQUIRE(m.input_dim() == 2 + 3 * 4 + 3);
  Params params(m, 1), grads(m, 2);
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.0f, 0.5f);
  std::vector<float> emb(3 * batch * 4), dense(batch * 2);
  for (float& v : emb) v = n(rng);
  for (float& v : dense) v = n(rng);
  const std::vector<float> labels = {1, 0, 0, 1};
  std::vector<float> emb_grads(emb.size());
  auto loss = [&]() {
    std::vector<float> scratch(emb.size());
    Params unused(m, 9);
    return *m.ComputeGradients(params.Reads(), emb.data(), dense.data(),
                               labels.data(), batch, unused.Writes(),
                               scratch.data());
  };
  REQUIRE(m.ComputeGradients(params.Reads(), emb.data(), dense.data(),
                             labels.data(), batch, grads.Writes(),
                             emb_grads.data())
              .ok());
  const float h = 1e-2f;
  auto check = [&](float* x, float analytic) {
    const float keep = *x;
    *x = keep + h;
    const double up = loss();
    *x = keep - h;
    const double down = loss();
    *x = keep;
    const double numeric = (up - down) / (2 * h);
    INFO("analytic " << analytic << " numeric " << numeric);
    REQUIRE(analytic == Approx(numeric).margin(2e-3).epsilon(2e-2));
  };
  for (size_t t = 0; t < params.values.size(); ++t) {
    for (size_t i = 0; i < params.values[t].size(); i += 3) {
      check(&params.values[t][i], grads.values[t][i]);
    }
  }
  for (size_t i = 0; i < emb.size(); ++i) check(&emb[i], emb_grads[i]);

  // Predict is the forward pass.
  std::vector<float> p(batch);
  REQUIRE(m.Predict(params.Reads(), emb.data(), dense.data(), batch, p.data())
              .ok());
  for (float v : p) {
    REQUIRE(v > 0.0f);
    REQUIRE(v < 1.0f);
  }
  // Bad calls are refused.
  REQUIRE(absl::IsInvalidArgument(
      m.ComputeGradients(params.Reads(), emb.data(), dense.data(),
                         labels.data(), batch + 1, grads.Writes(),
                         emb_grads.data())
          .status()));
  REQUIRE(
      absl::IsInvalidArgument(CtrModel::Create(config, 0, cpu.get()).status()));
}

}  // namespace
}  // namespace asyncps
