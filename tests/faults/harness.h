#ifndef ASYNCPS_TESTS_FAULTS_HARNESS_H_
#define ASYNCPS_TESTS_FAULTS_HARNESS_H_

// Helpers of the fault tests: real ps_server and ps_worker processes,
// their logs and Status.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/asyncps.pb.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace testing {

// Where Debian's dataset-fashion-mnist puts the data.
inline constexpr char kFashionMnist[] = "/usr/share/datasets/fashion-mnist";

// Starts runfile worker/ps_worker with `args` (plus --data_dir).
absl::StatusOr<std::unique_ptr<Subprocess>> StartWorker(
    std::vector<std::string> args);

// The value on the "final test accuracy: X" line of a log, or -1.
double FinalAccuracy(const std::string& log);

// Waits until the process's log contains `needle` (DEADLINE_EXCEEDED after
// `timeout`; FAILED_PRECONDITION if the process exits first).
absl::Status WaitForLog(Subprocess* process, absl::string_view needle,
                        absl::Duration timeout = absl::Seconds(60));
// The same for the first of `processes` to log it (FAILED_PRECONDITION once
// all exited without).
absl::Status WaitForAnyLog(const std::vector<Subprocess*>& processes,
                           absl::string_view needle,
                           absl::Duration timeout = absl::Seconds(60));

// One shard's Status (a raw stub, deadline 10 s).
absl::StatusOr<StatusResponse> ShardStatus(const std::string& address);

// The Status row of `worker_id`, or nullptr.
const WorkerStatus* FindWorker(const StatusResponse& status, int worker_id);

// The port of "127.0.0.1:<port>".
int PortOf(const std::string& address);

}  // namespace testing
}  // namespace asyncps

#endif  // ASYNCPS_TESTS_FAULTS_HARNESS_H_
