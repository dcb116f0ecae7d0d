#ifndef ASYNCPS_COMMON_IDENTITY_H_
#define ASYNCPS_COMMON_IDENTITY_H_

// A process's place in the cluster from what an orchestrator gives it, for
// `--shard_index=auto` and `--worker_id=auto`:
//   - a Kubernetes StatefulSet pod is named <statefulset>-<ordinal>, and its
//     host name (HOSTNAME) is the pod's name: shard index = ordinal;
//   - a Kubernetes Indexed Job sets JOB_COMPLETION_INDEX in every pod:
//     worker id = that index.
// Pure functions of the values passed in; main() reads the environment.

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace asyncps {

// The ordinal at the end of a StatefulSet pod's name: "asyncps-shard-3" ->
// 3. INVALID_ARGUMENT, naming the name, when it does not end in "-<digits>".
absl::StatusOr<int> OrdinalFromHostname(absl::string_view hostname);

// Resolves an index flag (--shard_index, --worker_id): a non-negative
// integer as given, or "auto": the ordinal of `hostname` (shards) or the
// value of `job_completion_index` (workers), whichever `auto_source` names.
// Errors are INVALID_ARGUMENT and name `flag` and where "auto" looked.
enum class AutoIndexSource { kHostnameOrdinal, kJobCompletionIndex };
absl::StatusOr<int> ResolveIndexFlag(
    absl::string_view flag, absl::string_view value, AutoIndexSource source,
    const std::optional<std::string>& hostname,
    const std::optional<std::string>& job_completion_index);

// The host name for ResolveIndexFlag: $HOSTNAME when set (a pod's name),
// else gethostname(). Reads the environment; for main() only.
std::optional<std::string> CurrentHostname();

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_IDENTITY_H_
