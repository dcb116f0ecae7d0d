#include "store/row_eviction.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/names.h"

namespace asyncps {

absl::Status EvictionRule::Validate(const TableSpec& spec) {
  const std::string table = absl::StrCat("table ", QuoteName(spec.name()));
  switch (spec.eviction()) {
    case EVICT_TTL:
    case EVICT_LRU:
    case EVICT_LFU:
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(table, ": unknown eviction policy ",
                       static_cast<int>(spec.eviction())));
  }
  if (spec.lfu_half_life_steps() != 0 && spec.eviction() != EVICT_LFU) {
    return absl::InvalidArgumentError(
        absl::StrCat(table, ": lfu_half_life_steps needs eviction EVICT_LFU"));
  }
  return absl::OkStatus();
}

EvictionRule::EvictionRule(const TableSpec& spec)
    : policy_(spec.eviction()),
      half_life_(spec.lfu_half_life_steps() != 0 ? spec.lfu_half_life_steps()
                                                 : kDefaultHalfLife) {}

float EvictionRule::CountAfterUse(float count, int64_t last,
                                  int64_t clock) const {
  if (clock <= last) return count + 1.0f;
  const double decay =
      std::exp2(-static_cast<double>(clock - last) / half_life_);
  return static_cast<float>(count * decay + 1.0);
}

double EvictionRule::Score(int64_t touched, float count, int64_t now) const {
  if (policy_ != EVICT_LFU) return static_cast<double>(touched);
  if (now <= touched) return count;
  return count * std::exp2(-static_cast<double>(now - touched) / half_life_);
}

double ScoreQuantile(std::vector<double>* samples, double fraction) {
  const size_t n = samples->size();
  const double at = std::clamp(fraction, 0.0, 1.0) * static_cast<double>(n);
  const size_t k = std::min(n - 1, static_cast<size_t>(at));
  std::nth_element(samples->begin(), samples->begin() + k, samples->end());
  return (*samples)[k];
}

}  // namespace asyncps
