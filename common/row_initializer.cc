#include "common/row_initializer.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "common/stable_hash.h"

namespace asyncps {

namespace {

// SplitMix64's increment (the golden ratio): stream positions j and j + 1
// are this far apart before mixing.
constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ull;

// 53 random bits as a double in (0, 1].
double OpenUnit(uint64_t bits) {
  return static_cast<double>((bits >> 11) + 1) * 0x1.0p-53;
}

}  // namespace

absl::Status ValidateRowInitializer(const TableSpec& spec) {
  if (!std::isfinite(spec.init_value())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", QuoteName(spec.name()), ": init_value is not finite"));
  }
  switch (spec.init()) {
    case INIT_ZEROS:
    case INIT_CONSTANT:
      return absl::OkStatus();
    case INIT_UNIFORM:
    case INIT_NORMAL:
      if (spec.init_value() < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("table ", QuoteName(spec.name()),
                         ": init_value (scale) must be >= 0"));
      }
      return absl::OkStatus();
    case INIT_GLOROT_UNIFORM:
      return absl::InvalidArgumentError(absl::StrCat(
          "table ", QuoteName(spec.name()),
          ": INIT_GLOROT_UNIFORM needs a fan-in, which a table does not "
          "have; use INIT_UNIFORM or INIT_NORMAL"));
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("table ", QuoteName(spec.name()),
                       ": unknown initializer ", spec.init()));
  }
}

RowInitializer::RowInitializer(const TableSpec& spec)
    : init_(spec.init()),
      value_(spec.init_value()),
      dim_(spec.dim()),
      key_(Mix64(spec.seed() ^ Mix64(StableHash(spec.name())))) {}

uint64_t RowInitializer::Bits(uint64_t id, uint64_t j) const {
  return Mix64(Mix64(id ^ key_) + (j + 1) * kGamma);
}

void RowInitializer::Fill(uint64_t id, float* out) const {
  switch (init_) {
    case INIT_CONSTANT:
      for (int j = 0; j < dim_; ++j) out[j] = value_;
      return;
    case INIT_UNIFORM:
      for (int j = 0; j < dim_; ++j) {
        // 24 random bits: every float in [-1, 1) of that grid is equally
        // likely.
        const float u =
            static_cast<float>(Bits(id, j) >> 40) * 0x1.0p-23f - 1.0f;
        out[j] = value_ * u;
      }
      return;
    case INIT_NORMAL:
      // Box-Muller: values 2k and 2k + 1 from bits 2k and 2k + 1.
      for (int j = 0; j < dim_; j += 2) {
        const double r = std::sqrt(-2.0 * std::log(OpenUnit(Bits(id, j))));
        const double theta = 2.0 * M_PI * OpenUnit(Bits(id, j + 1));
        out[j] = static_cast<float>(value_ * r * std::cos(theta));
        if (j + 1 < dim_) {
          out[j + 1] = static_cast<float>(value_ * r * std::sin(theta));
        }
      }
      return;
    case INIT_ZEROS:
    default:
      for (int j = 0; j < dim_; ++j) out[j] = 0.0f;
      return;
  }
}

}  // namespace asyncps
