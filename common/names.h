#ifndef ASYNCPS_COMMON_NAMES_H_
#define ASYNCPS_COMMON_NAMES_H_

// Checks and quoting of names that arrive from the network (tensor names)
// or from operators (run ids).

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace asyncps {

inline constexpr size_t kMaxNameBytes = 256;

// True when `s` is well-formed UTF-8 (no overlong forms, no surrogates,
// nothing above U+10FFFF).
bool IsValidUtf8(absl::string_view s);

// OK when `name` is 1..kMaxNameBytes bytes of UTF-8 without control
// characters; else INVALID_ARGUMENT naming `what` and quoting the name.
absl::Status CheckName(absl::string_view what, absl::string_view name);

inline constexpr size_t kMaxRunIdBytes = 128;

// OK when `run_id` is 0..kMaxRunIdBytes bytes of letters, digits and
// ._:@/+- (so it fits file names, labels and log lines as it is) and is not
// "any" (reserved: ps_server --adopt_run=any); else INVALID_ARGUMENT.
absl::Status CheckRunId(absl::string_view run_id);

// The name for an error message: in single quotes, cut to its first 64
// bytes (then "...(N bytes)"), control characters and bytes that are not
// UTF-8 escaped, so that a hostile name can neither flood a message nor
// break a terminal or log line.
std::string QuoteName(absl::string_view name);

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_NAMES_H_
