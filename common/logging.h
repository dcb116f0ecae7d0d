#ifndef ASYNCPS_COMMON_LOGGING_H_
#define ASYNCPS_COMMON_LOGGING_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "spdlog/spdlog.h"

namespace asyncps {

// Creates the process's logger (stderr, colour off, timestamped) named
// `name`, at `level` (trace|debug|info|warn|error|off). Called from main();
// libraries receive the logger through their Options.
absl::StatusOr<std::shared_ptr<spdlog::logger>> MakeLogger(
    const std::string& name, const std::string& level);

// A logger that discards everything, for tests and defaults.
std::shared_ptr<spdlog::logger> NullLogger();

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_LOGGING_H_
