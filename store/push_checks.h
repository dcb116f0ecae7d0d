#ifndef ASYNCPS_STORE_PUSH_CHECKS_H_
#define ASYNCPS_STORE_PUSH_CHECKS_H_

// The errors a push's dense slices (ShardStore) and sparse rows
// (TableStore) share, so that both refuse the same things in the same
// words. Built only once a check failed:
//
//   if (!AllFinite(payload)) {
//     return NotFiniteError(SliceName(g.tensor(), g.slice()),
//                           request.assign());
//   }

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/names.h"

namespace asyncps {

// "slice 3 of tensor 'w'", as errors name a slice.
inline std::string SliceName(absl::string_view tensor, uint32_t slice) {
  return absl::StrCat("slice ", slice, " of tensor ", QuoteName(tensor));
}

// INVALID_ARGUMENT: the gradient (or, for an assign, the values) of `what`
// holds NaN or Inf.
inline absl::Status NotFiniteError(absl::string_view what, bool assign) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": ", assign ? "values contain" : "gradient contains",
                   " NaN or Inf"));
}

// INVALID_ARGUMENT: the gradient of `what` (a `kind`: "slice", "row") says
// it was computed from a version the shard has not reached.
inline absl::Status FutureReadVersionError(absl::string_view what,
                                           absl::string_view kind,
                                           uint64_t read_version,
                                           uint64_t version) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": read_version ", read_version, " is newer than the ",
                   kind, " (version ", version, ")"));
}

}  // namespace asyncps

#endif  // ASYNCPS_STORE_PUSH_CHECKS_H_
