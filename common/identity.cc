#include "common/identity.h"

#include <unistd.h>

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace asyncps {
namespace {

// A non-negative decimal int without sign or spaces.
std::optional<int> ParseIndex(absl::string_view s) {
  if (s.empty() || s.size() > 9) return std::nullopt;
  for (char c : s) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) {
      return std::nullopt;
    }
  }
  int v = 0;
  if (!absl::SimpleAtoi(s, &v)) return std::nullopt;
  return v;
}

}  // namespace

absl::StatusOr<int> OrdinalFromHostname(absl::string_view hostname) {
  // A fully qualified name: the pod's name is the first label.
  const absl::string_view name = hostname.substr(0, hostname.find('.'));
  const size_t dash = name.rfind('-');
  std::optional<int> ordinal;
  if (dash != absl::string_view::npos && dash > 0) {
    ordinal = ParseIndex(name.substr(dash + 1));
  }
  if (!ordinal.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host name '", hostname,
        "' does not end in -<ordinal> as a StatefulSet pod's does"));
  }
  return *ordinal;
}

absl::StatusOr<int> ResolveIndexFlag(
    absl::string_view flag, absl::string_view value, AutoIndexSource source,
    const std::optional<std::string>& hostname,
    const std::optional<std::string>& job_completion_index) {
  if (value != "auto") {
    std::optional<int> index = ParseIndex(value);
    if (!index.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag,
                       " must be a non-negative integer or auto, "
                       "got '",
                       value, "'"));
    }
    return *index;
  }
  if (source == AutoIndexSource::kHostnameOrdinal) {
    if (!hostname.has_value() || hostname->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag,
                       "=auto: no host name to take the ordinal "
                       "from"));
    }
    absl::StatusOr<int> ordinal = OrdinalFromHostname(*hostname);
    if (!ordinal.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, "=auto: ", ordinal.status().message()));
    }
    return *ordinal;
  }
  if (!job_completion_index.has_value() || job_completion_index->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag,
                     "=auto: JOB_COMPLETION_INDEX is not set (a Kubernetes "
                     "Indexed Job sets it in every pod)"));
  }
  std::optional<int> index = ParseIndex(*job_completion_index);
  if (!index.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=auto: JOB_COMPLETION_INDEX='",
                     *job_completion_index, "' is not a non-negative integer"));
  }
  return *index;
}

std::optional<std::string> CurrentHostname() {
  const char* env = std::getenv("HOSTNAME");
  if (env != nullptr && *env != '\0') return std::string(env);
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return std::nullopt;
  return std::string(buf);
}

}  // namespace asyncps
