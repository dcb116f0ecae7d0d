// The update loops of store/optimizer.h against plain scalar loops written
// here. The store's loops are vectorized (SSE2 or AVX2, picked when the
// program loads); over slices longer than any vector, with a tail, in both
// wire encodings and with a value split between two pieces, they must give
// exactly these floats: no fused multiply-add, no approximate square root
// or reciprocal, the same order of operations. Rows (RowUpdater) run the
// same arithmetic.

#include "store/optimizer.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/payload.h"
#include "tests/testing/tensor_specs.h"

namespace asyncps {
namespace {

constexpr size_t kN = 1027;  // not a multiple of any vector width

OptimizerSpec Spec(OptimizerType type) {
  return testing::AnyTypeSpec(type, 0.01f, 1e-7f);
}

// Gradients of step t over many magnitudes.
std::vector<float> Gradient(uint64_t t) {
  std::vector<float> g(kN);
  for (size_t i = 0; i < kN; ++i) {
    g[i] = std::ldexp(std::sin(static_cast<float>(i * t) + 0.5f),
                      static_cast<int>(i % 21) - 10);
  }
  return g;
}

// The values as the wire carries them, and what the shard reads back.
std::string Encode(const std::vector<float>& g, WireDtype dtype,
                   std::vector<float>* as_read) {
  std::string bytes(g.size() * WireBytes(dtype), '\0');
  if (dtype == WIRE_BF16) {
    EncodeBf16(g.data(), g.size(), bytes.data());
  } else {
    std::memcpy(bytes.data(), g.data(), bytes.size());
  }
  as_read->resize(g.size());
  DecodePayload(Payload(bytes, dtype), as_read->data());
  return bytes;
}

// The reference: one float at a time, the formulas of store/optimizer.cc.
struct Reference {
  explicit Reference(OptimizerType type)
      : type(type),
        w(kN, 0.25f),
        a(kN, type == OPT_ADAGRAD ? 0.1f : 0.0f),
        b(kN, 0.0f) {}
  void Step(const std::vector<float>& g, uint64_t t) {
    const float lr = 0.01f, mu = 0.9f, b1 = 0.9f, b2 = 0.999f, eps = 1e-7f;
    const float c1 = static_cast<float>(1.0 / (1.0 - std::pow(double{b1}, t)));
    const float c2 = static_cast<float>(1.0 / (1.0 - std::pow(double{b2}, t)));
    for (size_t i = 0; i < kN; ++i) {
      switch (type) {
        case OPT_SGD:
          w[i] -= lr * g[i];
          break;
        case OPT_MOMENTUM:
          a[i] = mu * a[i] + g[i];
          w[i] -= lr * a[i];
          break;
        case OPT_ADAGRAD:
          a[i] += g[i] * g[i];
          w[i] -= lr * g[i] / (std::sqrt(a[i]) + eps);
          break;
        default:  // Adam
          a[i] = b1 * a[i] + (1 - b1) * g[i];
          b[i] = b2 * b[i] + (1 - b2) * g[i] * g[i];
          w[i] -= lr * (a[i] * c1) / (std::sqrt(b[i] * c2) + eps);
          break;
      }
    }
  }
  OptimizerType type;
  std::vector<float> w, a, b;
};

TEST_CASE("slice loops give a scalar loop's floats bit for bit",
          "[optimizer]") {
  for (OptimizerType type : {OPT_SGD, OPT_MOMENTUM, OPT_ADAM, OPT_ADAGRAD}) {
    for (WireDtype dtype : {WIRE_F32, WIRE_BF16}) {
      CAPTURE(type, dtype);
      auto opt = SliceOptimizer::Create(Spec(type), kN);
      std::vector<float> w(kN, 0.25f);
      Reference ref(type);
      for (uint64_t t = 1; t <= 3; ++t) {
        std::vector<float> g;
        const std::string bytes = Encode(Gradient(t), dtype, &g);
        // Two pieces, the cut inside a value (as frames arrive).
        const size_t cut = 5 * WireBytes(dtype) + 1;
        Payload p(absl::string_view(bytes).substr(0, cut), dtype);
        p.Append(absl::string_view(bytes).substr(cut));
        opt->Apply(w.data(), p, 1.0f, t);
        ref.Step(g, t);
      }
      REQUIRE(w == ref.w);
    }
  }
}

TEST_CASE("row updates give the same floats as a slice", "[optimizer]") {
  for (OptimizerType type : {OPT_SGD, OPT_MOMENTUM, OPT_ADAM, OPT_ADAGRAD}) {
    CAPTURE(type);
    const OptimizerSpec spec = Spec(type);
    RowUpdater rows(spec, static_cast<int>(kN));
    std::vector<float> w(kN, 0.25f);
    std::vector<float> state(static_cast<size_t>(rows.state_floats()));
    rows.InitState(state.data());
    Reference ref(type);
    for (uint64_t t = 1; t <= 3; ++t) {
      const std::vector<float> g = Gradient(t);
      rows.Apply(w.data(), state.data(), g.data(), 1.0f, t);
      ref.Step(g, t);
    }
    REQUIRE(w == ref.w);
  }
}

}  // namespace
}  // namespace asyncps
