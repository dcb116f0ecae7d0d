#ifndef ASYNCPS_STORE_STALENESS_RULE_H_
#define ASYNCPS_STORE_STALENESS_RULE_H_

#include <cstdint>

namespace asyncps {

// How stale a pushed gradient may be, and how staleness scales it; the same
// rule for dense slices and sparse rows.
struct StalenessRule {
  int64_t max_staleness = -1;  // -1 = unbounded
  bool inverse_lr = false;     // lr / (1 + staleness)

  // True when a gradient computed `staleness` updates ago is refused.
  bool Refuses(uint64_t staleness) const {
    return max_staleness >= 0 &&
           staleness > static_cast<uint64_t>(max_staleness);
  }
  // The factor on the learning rate of a gradient computed `staleness`
  // updates ago that is applied.
  float LrScale(uint64_t staleness) const {
    return inverse_lr ? 1.0f / (1.0f + static_cast<float>(staleness)) : 1.0f;
  }
};

}  // namespace asyncps

#endif  // ASYNCPS_STORE_STALENESS_RULE_H_
