#ifndef ASYNCPS_STORE_STALENESS_RULE_H_
#define ASYNCPS_STORE_STALENESS_RULE_H_

#include <cstdint>

namespace asyncps {

// How stale a pushed gradient may be, and how staleness scales it; the same
// rule for dense slices and sparse rows.
struct StalenessRule {
  int64_t max_staleness = -1;  // -1 = unbounded
  bool inverse_lr = false;     // lr / (1 + staleness)
};

}  // namespace asyncps

#endif  // ASYNCPS_STORE_STALENESS_RULE_H_
