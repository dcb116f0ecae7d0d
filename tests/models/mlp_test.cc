// Spec for the MLP: analytic gradients agree with finite differences, the
// loss matches hand-computed values, backend errors come back with the
// Mlp's context, and plain SGD on the real Fashion-MNIST data learns.

#include "models/mlp.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "data/idx_reader.h"
#include "kernels/backend.h"
#include "kernels/cpu_backend.h"
#include "proto/asyncps.pb.h"
#include "tests/testing/faulty_backend.h"
#include "worker/partition.h"

namespace asyncps {
namespace {

// Host storage for one set of model parameters (or gradients).
struct HostParams {
  explicit HostParams(const Mlp& m) {
    for (const ParamInfo& p : m.params()) {
      values.emplace_back(p.num_elements(), 0.0f);
    }
  }
  std::vector<const float*> ConstPtrs() const {
    std::vector<const float*> out;
    for (const auto& v : values) out.push_back(v.data());
    return out;
  }
  std::vector<float*> Ptrs() {
    std::vector<float*> out;
    for (auto& v : values) out.push_back(v.data());
    return out;
  }
  std::vector<std::vector<float>> values;
};

// Glorot-uniform weights, small uniform biases.
void RandomInit(const Mlp& m, HostParams& p, std::mt19937_64& rng,
                float bias_scale) {
  for (size_t i = 0; i < m.params().size(); ++i) {
    const ParamInfo& info = m.params()[i];
    float scale = bias_scale;
    if (!info.is_bias) {
      scale = std::sqrt(6.0f / (info.shape[0] + info.shape[1]));
    }
    std::uniform_real_distribution<float> dist(-scale, scale);
    for (float& v : p.values[i]) v = dist(rng);
  }
}

// The smallest |pre-activation| of any hidden unit, computed in double on
// the host: finite differences are only valid away from ReLU kinks.
double MinHiddenMargin(const Mlp& m, const HostParams& p,
                       const std::vector<float>& x, int batch) {
  const std::vector<int>& sizes = m.layer_sizes();
  std::vector<double> a(x.begin(), x.end());
  double margin = 1e30;
  for (size_t l = 0; l + 1 < sizes.size(); ++l) {
    const int in = sizes[l], out = sizes[l + 1];
    const std::vector<float>& w = p.values[2 * l];
    const std::vector<float>& b = p.values[2 * l + 1];
    std::vector<double> y(size_t(batch) * out);
    for (int r = 0; r < batch; ++r) {
      for (int c = 0; c < out; ++c) {
        double s = b[c];
        for (int k = 0; k < in; ++k) s += a[r * in + k] * w[k * out + c];
        if (l + 2 < sizes.size()) {
          margin = std::min(margin, std::fabs(s));
          s = std::max(s, 0.0);
        }
        y[r * out + c] = s;
      }
    }
    a = std::move(y);
  }
  return margin;
}

void CheckGradientsByFiniteDifferences(std::vector<int> sizes, int batch,
                                       uint64_t seed) {
  CpuBackend backend;
  auto mlp = Mlp::Create(sizes, batch, &backend);
  REQUIRE(mlp.ok());
  Mlp& m = **mlp;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  HostParams params(m);
  std::vector<float> x(size_t(batch) * sizes.front());
  std::vector<int32_t> labels(batch);
  // Resample until every hidden pre-activation is at least 0.05 from the
  // ReLU kink; a perturbation of eps = 1e-3 moves a pre-activation by far
  // less than that, so the loss is smooth over the difference stencil.
  int tries = 0;
  do {
    REQUIRE(++tries < 1000);
    RandomInit(m, params, rng, /*bias_scale=*/0.5f);
    for (float& v : x) v = unit(rng);
    for (int32_t& l : labels) l = static_cast<int32_t>(rng() % sizes.back());
  } while (MinHiddenMargin(m, params, x, batch) < 0.05);

  HostParams grads(m);
  auto res = m.ComputeGradients(params.ConstPtrs(), x.data(), labels.data(),
                                batch, grads.Ptrs());
  REQUIRE(res.ok());
  // Evaluate gives the same mean loss as the training pass.
  auto eval = m.Evaluate(params.ConstPtrs(), x.data(), labels.data(), batch);
  REQUIRE(eval.ok());
  CHECK(eval->mean_loss == Approx(res->mean_loss).epsilon(1e-12));

  // Tolerance: the forward pass runs in float32, so each loss evaluation
  // carries a rounding error of about 1e-7 (loss ~1, 24-bit mantissa, a few
  // dozen operations). The central difference divides the difference of two
  // such values by 2 * eps = 2e-3, giving an absolute error up to ~1e-4;
  // the O(eps^2) truncation term is ~1e-6. Gradients here are 1e-3..1, so
  // we allow 3e-4 absolute plus 1% relative: a wrong formula (a missing
  // transpose, factor or ReLU mask) is off by far more than that.
  const float eps = 1e-3f;
  int checked = 0;
  for (size_t i = 0; i < m.params().size(); ++i) {
    for (size_t j = 0; j < params.values[i].size(); ++j) {
      const float saved = params.values[i][j];
      params.values[i][j] = saved + eps;
      auto plus =
          m.Evaluate(params.ConstPtrs(), x.data(), labels.data(), batch);
      params.values[i][j] = saved - eps;
      auto minus =
          m.Evaluate(params.ConstPtrs(), x.data(), labels.data(), batch);
      params.values[i][j] = saved;
      REQUIRE(plus.ok());
      REQUIRE(minus.ok());
      const double fd = (plus->mean_loss - minus->mean_loss) / (2.0 * eps);
      const double g = grads.values[i][j];
      INFO(m.params()[i].name << "[" << j << "] analytic " << g << " fd "
                              << fd);
      CHECK(std::fabs(g - fd) <= 3e-4 + 1e-2 * std::fabs(fd));
      ++checked;
    }
  }
  int64_t total = 0;
  for (const ParamInfo& p : m.params()) total += p.num_elements();
  CHECK(checked == total);
}

TEST_CASE("gradients match finite differences, one hidden layer",
          "[mlp][gradients]") {
  CheckGradientsByFiniteDifferences({5, 4, 3}, 3, 1);
}

TEST_CASE("gradients match finite differences, two hidden layers",
          "[mlp][gradients]") {
  CheckGradientsByFiniteDifferences({6, 5, 4, 3}, 4, 2);
}

TEST_CASE("gradients match finite differences, softmax regression",
          "[mlp][gradients]") {
  CheckGradientsByFiniteDifferences({7, 4}, 5, 3);
}

TEST_CASE("parameters are named fc<i>/w [in, out] and fc<i>/b [out]", "[mlp]") {
  CpuBackend backend;
  auto mlp = Mlp::Create({784, 256, 128, 10}, 64, &backend);
  REQUIRE(mlp.ok());
  const std::vector<ParamInfo>& p = (*mlp)->params();
  REQUIRE(p.size() == 6);
  CHECK(p[0].name == "fc0/w");
  CHECK(p[0].shape == std::vector<int64_t>{784, 256});
  CHECK_FALSE(p[0].is_bias);
  CHECK(p[1].name == "fc0/b");
  CHECK(p[1].shape == std::vector<int64_t>{256});
  CHECK(p[1].is_bias);
  CHECK(p[4].name == "fc2/w");
  CHECK(p[4].shape == std::vector<int64_t>{128, 10});
  CHECK(p[5].name == "fc2/b");
  CHECK(p[5].num_elements() == 10);
  CHECK((*mlp)->input_dim() == 784);
  CHECK((*mlp)->num_classes() == 10);
}

TEST_CASE("MlpSpecs are the tensors of Mlp::params(), initialized", "[mlp]") {
  CpuBackend backend;
  auto mlp = Mlp::Create({784, 256, 10}, 8, &backend);
  REQUIRE(mlp.ok());
  OptimizerSpec adam;
  adam.set_type(OPT_ADAM);
  const std::vector<TensorSpec> specs =
      MlpSpecs((*mlp)->layer_sizes(), adam, 42);
  const std::vector<ParamInfo>& params = (*mlp)->params();
  REQUIRE(specs.size() == params.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    INFO(params[i].name);
    CHECK(specs[i].name() == params[i].name);
    CHECK(std::vector<int64_t>(specs[i].shape().begin(),
                               specs[i].shape().end()) == params[i].shape);
    CHECK(specs[i].init() ==
          (params[i].is_bias ? INIT_ZEROS : INIT_GLOROT_UNIFORM));
    CHECK(specs[i].seed() == 42u);
    CHECK(specs[i].optimizer().type() == OPT_ADAM);
  }
}

TEST_CASE("softmax regression loss and gradients on a hand-computed input",
          "[mlp]") {
  CpuBackend backend;
  auto mlp = Mlp::Create({2, 3}, 2, &backend);
  REQUIRE(mlp.ok());
  // W = [[ln 2, 0, ln 3], [0, 0, 0]], b = 0.
  // x0 = (1, 0): logits (ln 2, 0, ln 3), softmax (2, 1, 3) / 6, label 2:
  //   loss ln 2, correct.
  // x1 = (0, 1): logits (0, 0, 0), softmax 1/3 each, label 0: loss ln 3,
  //   correct (ties go to the lowest index).
  const std::vector<float> w = {std::log(2.0f), 0.0f, std::log(3.0f),
                                0.0f,           0.0f, 0.0f};
  const std::vector<float> b = {0.0f, 0.0f, 0.0f};
  const std::vector<float> x = {1, 0, 0, 1};
  const std::vector<int32_t> labels = {2, 0};
  std::vector<float> dw(6), db(3);
  auto res = (*mlp)->ComputeGradients({w.data(), b.data()}, x.data(),
                                      labels.data(), 2, {dw.data(), db.data()});
  REQUIRE(res.ok());
  CHECK(res->mean_loss == Approx((std::log(2.0) + std::log(3.0)) / 2));
  CHECK(res->correct == 2);
  // d loss / d logits = (softmax - onehot) / 2; dW row r = that of x_r.
  const double d0[] = {2.0 / 12, 1.0 / 12, -3.0 / 12};
  const double d1[] = {-2.0 / 6, 1.0 / 6, 1.0 / 6};
  for (int c = 0; c < 3; ++c) {
    CHECK(dw[c] == Approx(d0[c]).margin(1e-6));
    CHECK(dw[3 + c] == Approx(d1[c]).margin(1e-6));
    CHECK(db[c] == Approx(d0[c] + d1[c]).margin(1e-6));
  }
}

TEST_CASE(
    "Evaluate with all-zero parameters gives ln(10) and class-0 "
    "accuracy",
    "[mlp][data]") {
  auto test = LoadFashionMnist(kDefaultFashionMnistDir, Split::kTest);
  REQUIRE(test.ok());
  CpuBackend backend;
  // 10000 is not a multiple of 96, so the last chunk is partial.
  auto mlp = Mlp::Create({784, 32, 10}, 96, &backend);
  REQUIRE(mlp.ok());
  HostParams zeros(**mlp);
  auto res = (*mlp)->Evaluate(zeros.ConstPtrs(), test->images.data(),
                              test->labels.data(), test->n);
  REQUIRE(res.ok());
  CHECK(res->mean_loss == Approx(std::log(10.0)).epsilon(1e-6));
  // All logits tie, so every prediction is class 0: 1000 of the 10000 test
  // examples are class 0.
  CHECK(res->correct == 1000);
}

TEST_CASE("invalid calls are INVALID_ARGUMENT", "[mlp]") {
  CpuBackend backend;
  CHECK(absl::IsInvalidArgument(Mlp::Create({5}, 4, &backend).status()));
  CHECK(absl::IsInvalidArgument(Mlp::Create({5, 0, 3}, 4, &backend).status()));
  CHECK(absl::IsInvalidArgument(Mlp::Create({5, 3}, 0, &backend).status()));
  CHECK(absl::IsInvalidArgument(Mlp::Create({5, 3}, 4, nullptr).status()));

  auto mlp = Mlp::Create({2, 3}, 2, &backend);
  REQUIRE(mlp.ok());
  Mlp& m = **mlp;
  HostParams p(m), g(m);
  std::vector<float> x(3 * 2, 0.0f);
  std::vector<int32_t> labels = {0, 1, 2};
  auto call = [&](int batch) {
    return m.ComputeGradients(p.ConstPtrs(), x.data(), labels.data(), batch,
                              g.Ptrs());
  };
  CHECK(call(2).ok());
  CHECK(absl::IsInvalidArgument(call(0).status()));
  CHECK(absl::IsInvalidArgument(call(3).status()));  // above max_batch
  CHECK(
      absl::IsInvalidArgument(m.ComputeGradients({p.values[0].data()}, x.data(),
                                                 labels.data(), 2, g.Ptrs())
                                  .status()));
  CHECK(absl::IsInvalidArgument(
      m.ComputeGradients(p.ConstPtrs(), x.data(), labels.data(), 2,
                         {g.values[0].data(), nullptr})
          .status()));
  labels[1] = 3;  // out of range for 3 classes
  CHECK(absl::IsInvalidArgument(call(2).status()));
  CHECK(absl::IsInvalidArgument(
      m.Evaluate(p.ConstPtrs(), x.data(), labels.data(), 2).status()));
  CHECK(absl::IsInvalidArgument(
      m.Evaluate(p.ConstPtrs(), x.data(), labels.data(), 0).status()));
}

TEST_CASE("a backend error fails the training step with its message",
          "[mlp][errors]") {
  // Every operation of a training step, failing at its first and at a later
  // call; the step must return the backend's code and message, with the
  // Mlp's context in front.
  struct Case {
    std::string op;
    int at;
    std::string context;
  };
  const std::vector<Case> cases = {
      {"CopyToDevice", 1, "Mlp upload of fc0/w"},
      {"CopyToDevice", 5, "Mlp input upload"},
      {"Gemm", 1, "Mlp forward layer 0"},
      {"BiasActivation", 2, "Mlp forward layer 1"},
      {"SoftmaxCrossEntropy", 1, "Mlp loss"},
      {"Gemm", 3, "Mlp backward layer 1"},
      {"ColumnSum", 2, "Mlp backward layer 0"},
      {"ReluBackward", 1, "Mlp backward layer 1"},
      {"CopyToHost", 4, "Mlp download of fc1/b gradient"},
  };
  const absl::Status device_error = absl::InternalError(
      "Gemm: cublasSgemm: CUBLAS_STATUS_EXECUTION_FAILED (the GPU program "
      "failed to execute)");
  for (const Case& c : cases) {
    INFO(c.op << " call " << c.at);
    FaultyBackend backend(c.op, c.at, device_error);
    auto mlp = Mlp::Create({6, 5, 3}, 4, &backend);
    REQUIRE(mlp.ok());
    HostParams p(**mlp), g(**mlp);
    std::vector<float> x(4 * 6, 0.25f);
    std::vector<int32_t> labels = {0, 1, 2, 1};
    auto r = (*mlp)->ComputeGradients(p.ConstPtrs(), x.data(), labels.data(), 4,
                                      g.Ptrs());
    INFO(r.status().ToString());
    CHECK(backend.calls() == c.at);  // the fault was reached
    CHECK(r.status().code() == absl::StatusCode::kInternal);
    CHECK(r.status().message() ==
          c.context + ": " + std::string(device_error.message()));
  }
}

TEST_CASE("a backend error fails Evaluate, also in a later chunk",
          "[mlp][errors]") {
  // 10 examples in chunks of 4: the third SoftmaxCrossEntropy is the last
  // (partial) chunk.
  FaultyBackend backend("SoftmaxCrossEntropy", 3,
                        absl::InternalError("SoftmaxCrossEntropy: "
                                            "cudaStreamSynchronize: "
                                            "cudaErrorIllegalAddress"));
  auto mlp = Mlp::Create({6, 3}, 4, &backend);
  REQUIRE(mlp.ok());
  HostParams p(**mlp);
  std::vector<float> x(10 * 6, 0.5f);
  std::vector<int32_t> labels(10, 2);
  auto r = (*mlp)->Evaluate(p.ConstPtrs(), x.data(), labels.data(), 10);
  CHECK(backend.calls() == 3);
  CHECK(absl::IsInternal(r.status()));
  CHECK(r.status().message() ==
        "Mlp loss: SoftmaxCrossEntropy: cudaStreamSynchronize: "
        "cudaErrorIllegalAddress");
}

TEST_CASE("Mlp::Create fails when the backend cannot allocate",
          "[mlp][errors]") {
  // An injected out-of-memory on the third buffer (fc0/b)...
  FaultyBackend faulty("Alloc", 3,
                       absl::ResourceExhaustedError(
                           "Alloc(5 floats): cudaMalloc: "
                           "cudaErrorMemoryAllocation (out of memory)"));
  auto mlp = Mlp::Create({6, 5, 3}, 4, &faulty);
  INFO(mlp.status().ToString());
  CHECK(absl::IsResourceExhausted(mlp.status()));
  CHECK(mlp.status().message() ==
        "Mlp fc0/b: Alloc(5 floats): cudaMalloc: cudaErrorMemoryAllocation "
        "(out of memory)");
  // ...and a real one: 2^30 x 2^30 weights do not fit in any address space.
  CpuBackend cpu;
  auto huge = Mlp::Create({1 << 30, 1 << 30}, 1, &cpu);
  INFO(huge.status().ToString());
  CHECK(absl::IsResourceExhausted(huge.status()));
  CHECK(huge.status().message().find("Mlp fc0/w: Alloc(") == 0);
}

TEST_CASE("ParseLayerSizes builds input, hidden and class sizes", "[mlp]") {
  auto a = ParseLayerSizes("256,128", 784, 10);
  REQUIRE(a.ok());
  CHECK(*a == std::vector<int>{784, 256, 128, 10});
  auto b = ParseLayerSizes("", 784, 10);
  REQUIRE(b.ok());
  CHECK(*b == std::vector<int>{784, 10});
  auto c = ParseLayerSizes(" 64 , 32 ", 784, 10);
  REQUIRE(c.ok());
  CHECK(*c == std::vector<int>{784, 64, 32, 10});
  CHECK(absl::IsInvalidArgument(ParseLayerSizes("256,,128", 784, 10).status()));
  CHECK(absl::IsInvalidArgument(ParseLayerSizes("256,x", 784, 10).status()));
  CHECK(absl::IsInvalidArgument(ParseLayerSizes("-4", 784, 10).status()));
  CHECK(absl::IsInvalidArgument(ParseLayerSizes("0", 784, 10).status()));
  CHECK(absl::IsInvalidArgument(ParseLayerSizes("", 0, 10).status()));
}

TEST_CASE("plain SGD on Fashion-MNIST reaches 70% test accuracy",
          "[mlp][data][training]") {
  auto train = LoadFashionMnist(kDefaultFashionMnistDir, Split::kTrain);
  REQUIRE(train.ok());
  auto test = LoadFashionMnist(kDefaultFashionMnistDir, Split::kTest);
  REQUIRE(test.ok());

  constexpr int kBatch = 64;
  constexpr int kSteps = 300;
  constexpr float kLr = 0.1f;
  CpuBackend backend;
  auto mlp = Mlp::Create({784, 128, 10}, 256, &backend);
  REQUIRE(mlp.ok());
  Mlp& m = **mlp;
  std::mt19937_64 rng(2024);
  HostParams params(m), grads(m);
  RandomInit(m, params, rng, /*bias_scale=*/0.0f);

  auto before = m.Evaluate(params.ConstPtrs(), test->images.data(),
                           test->labels.data(), test->n);
  REQUIRE(before.ok());

  auto share = WorkerShare(train->n, 1, 0);
  REQUIRE(share.ok());
  std::vector<int64_t> order = EpochOrder(*share, 7, 0, 0);
  std::vector<float> x(size_t(kBatch) * m.input_dim());
  std::vector<int32_t> y(kBatch);
  double last_loss = 0;
  for (int step = 0; step < kSteps; ++step) {
    for (int r = 0; r < kBatch; ++r) {
      const int64_t idx = order[(size_t(step) * kBatch + r) % order.size()];
      std::copy_n(&train->images[idx * train->dim], train->dim,
                  &x[size_t(r) * train->dim]);
      y[r] = train->labels[idx];
    }
    auto res = m.ComputeGradients(params.ConstPtrs(), x.data(), y.data(),
                                  kBatch, grads.Ptrs());
    REQUIRE(res.ok());
    REQUIRE(std::isfinite(res->mean_loss));
    last_loss = res->mean_loss;
    for (size_t i = 0; i < params.values.size(); ++i) {
      for (size_t j = 0; j < params.values[i].size(); ++j) {
        params.values[i][j] -= kLr * grads.values[i][j];
      }
    }
  }
  auto after = m.Evaluate(params.ConstPtrs(), test->images.data(),
                          test->labels.data(), test->n);
  REQUIRE(after.ok());
  const double accuracy = double(after->correct) / test->n;
  INFO("test accuracy " << accuracy << " loss " << after->mean_loss
                        << " (before: " << before->mean_loss
                        << "), last batch loss " << last_loss);
  CHECK(accuracy >= 0.70);
  CHECK(after->mean_loss < before->mean_loss);
  WARN("Fashion-MNIST test accuracy after " << kSteps
                                            << " SGD steps: " << accuracy);
}

}  // namespace
}  // namespace asyncps
