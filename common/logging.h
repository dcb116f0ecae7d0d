#ifndef ASYNCPS_COMMON_LOGGING_H_
#define ASYNCPS_COMMON_LOGGING_H_

#include <cstdint>
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

// Sends the gRPC library's own log lines (which it otherwise prints to
// stderr in its own format) to `logger`, prefixed "grpc:": its errors at
// `error_level`, everything else at debug; lines about failed TLS
// handshakes (one per refused connection) at most once per 10 s, with the
// count of those held back. A null logger discards them.
// Process-wide (gRPC has one log sink); call once from main() before the
// first channel or server. The logger must live until the process ends.
void RouteGrpcLogs(std::shared_ptr<spdlog::logger> logger,
                   spdlog::level::level_enum error_level);

// TLS handshakes that gRPC reported as failed (counted from its log lines
// once RouteGrpcLogs is in place): on a server, clients refused for their
// certificate or for not speaking TLS.
uint64_t GrpcHandshakeFailures();

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_LOGGING_H_
