#include "common/initializer.h"

#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/stable_hash.h"

namespace asyncps {

absl::Status ValidateInitializer(const TensorSpec& spec) {
  if (!std::isfinite(spec.init_value())) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", spec.name(), "': init_value is not finite"));
  }
  switch (spec.init()) {
    case INIT_ZEROS:
    case INIT_CONSTANT:
    case INIT_GLOROT_UNIFORM:
    case INIT_VALUES:
      return absl::OkStatus();
    case INIT_UNIFORM:
    case INIT_NORMAL:
      if (spec.init_value() < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", spec.name(), "': init_value (scale) must be >= 0"));
      }
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", spec.name(), "': unknown initializer ", spec.init()));
  }
}

void InitializeSlice(const TensorSpec& spec, const TensorLayout& layout,
                     uint32_t slice, float* out) {
  const int64_t n = layout.SliceSize(slice);
  // One independent stream per (seed, tensor, slice).
  std::seed_seq seq{static_cast<uint32_t>(spec.seed()),
                    static_cast<uint32_t>(spec.seed() >> 32),
                    static_cast<uint32_t>(StableHash(spec.name())),
                    static_cast<uint32_t>(StableHash(spec.name()) >> 32),
                    slice};
  std::mt19937_64 rng(seq);
  switch (spec.init()) {
    case INIT_CONSTANT:
      for (int64_t i = 0; i < n; ++i) out[i] = spec.init_value();
      return;
    case INIT_UNIFORM: {
      std::uniform_real_distribution<float> d(-spec.init_value(),
                                              spec.init_value());
      for (int64_t i = 0; i < n; ++i) out[i] = d(rng);
      return;
    }
    case INIT_NORMAL: {
      std::normal_distribution<float> d(0.0f, spec.init_value());
      for (int64_t i = 0; i < n; ++i) out[i] = d(rng);
      return;
    }
    case INIT_GLOROT_UNIFORM: {
      const float a = std::sqrt(
          6.0f / static_cast<float>(layout.fan_in() + layout.fan_out()));
      std::uniform_real_distribution<float> d(-a, a);
      for (int64_t i = 0; i < n; ++i) out[i] = d(rng);
      return;
    }
    case INIT_ZEROS:
    case INIT_VALUES:  // the values come with the request, not from here
    default:
      for (int64_t i = 0; i < n; ++i) out[i] = 0.0f;
      return;
  }
}

}  // namespace asyncps
