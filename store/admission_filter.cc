#include "store/admission_filter.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "common/stable_hash.h"

namespace asyncps {

namespace {

constexpr uint64_t kSketchSalt = 0x736b657463680000ull;
constexpr uint64_t kDrawSalt = 0x61646d6974000000ull;

uint64_t ProbabilityBits(const TableSpec& spec) {
  if (spec.admission() != ADMIT_PROBABILITY) return 0;
  const double p = spec.admit_probability();
  if (p >= 1.0) return ~uint64_t{0};
  return static_cast<uint64_t>(std::ldexp(p, 64));
}

}  // namespace

CountMinSketch::CountMinSketch(uint32_t width, uint64_t seed)
    : mask_(width - 1),
      seed_(Mix64(seed ^ kSketchSalt)),
      counts_(static_cast<size_t>(kDepth) * width, 0) {}

void CountMinSketch::Positions(uint64_t id, uint32_t* at) const {
  // Double hashing: row r uses h1 + r * h2 (h2 odd: distinct per row).
  const uint64_t h = Mix64(id ^ seed_);
  const uint32_t h1 = static_cast<uint32_t>(h);
  const uint32_t h2 = static_cast<uint32_t>(h >> 32) | 1u;
  const uint32_t width = mask_ + 1;
  for (int r = 0; r < kDepth; ++r) {
    at[r] = r * width + ((h1 + static_cast<uint32_t>(r) * h2) & mask_);
  }
}

uint32_t CountMinSketch::Add(uint64_t id) {
  uint32_t at[kDepth];
  Positions(id, at);
  uint32_t low = kMaxCount;
  for (uint32_t i : at) low = std::min<uint32_t>(low, counts_[i]);
  if (low == kMaxCount) return low;
  const uint32_t next = low + 1;
  for (uint32_t i : at) {
    if (counts_[i] < next) counts_[i] = static_cast<uint8_t>(next);
  }
  if (++adds_ >= uint64_t{16} * (mask_ + 1)) {
    for (uint8_t& c : counts_) c >>= 1;
    adds_ = 0;
  }
  return next;
}

uint32_t CountMinSketch::Estimate(uint64_t id) const {
  uint32_t at[kDepth];
  Positions(id, at);
  uint32_t low = kMaxCount;
  for (uint32_t i : at) low = std::min<uint32_t>(low, counts_[i]);
  return low;
}

absl::Status AdmissionRule::Validate(const TableSpec& spec) {
  const std::string table = absl::StrCat("table ", QuoteName(spec.name()));
  const uint32_t w = spec.admit_sketch_width();
  switch (spec.admission()) {
    case ADMIT_ALL:
      if (spec.admit_count() != 0 || spec.admit_probability() != 0 || w != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            table,
            ": admit_count, admit_probability and admit_sketch_width need "
            "admission ADMIT_COUNT or ADMIT_PROBABILITY"));
      }
      return absl::OkStatus();
    case ADMIT_COUNT:
      if (spec.admit_count() < 1 ||
          spec.admit_count() > CountMinSketch::kMaxCount) {
        return absl::InvalidArgumentError(absl::StrCat(
            table, ": admit_count must be in [1, ", CountMinSketch::kMaxCount,
            "], got ", spec.admit_count()));
      }
      break;
    case ADMIT_PROBABILITY:
      if (!(spec.admit_probability() > 0 && spec.admit_probability() <= 1)) {
        return absl::InvalidArgumentError(
            absl::StrCat(table, ": admit_probability must be in (0, 1], got ",
                         spec.admit_probability()));
      }
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(table, ": unknown admission policy ",
                       static_cast<int>(spec.admission())));
  }
  if (w != 0 && (w < 64 || w > kMaxSketchWidth || (w & (w - 1)) != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        table, ": admit_sketch_width must be a power of two in [64, ",
        kMaxSketchWidth, "] (or 0), got ", w));
  }
  return absl::OkStatus();
}

AdmissionRule::AdmissionRule(const TableSpec& spec)
    : policy_(spec.admission()),
      count_(spec.admit_count()),
      probability_bits_(ProbabilityBits(spec)),
      seed_(Mix64(spec.seed() ^ kDrawSalt)),
      width_(spec.admit_sketch_width() != 0 ? spec.admit_sketch_width()
                                            : kDefaultSketchWidth) {}

bool AdmissionRule::Admits(uint64_t id, uint32_t count) const {
  switch (policy_) {
    case ADMIT_COUNT:
      return count >= count_;
    case ADMIT_PROBABILITY:
      // One draw per (id, occurrence): reproducible, independent of timing.
      return probability_bits_ == ~uint64_t{0} ||
             Mix64(seed_ ^ Mix64(id + count)) < probability_bits_;
    default:
      return true;
  }
}

}  // namespace asyncps
