#include "common/logging.h"

#include <grpc/support/log.h>

#include <atomic>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/log_limiter.h"
#include "spdlog/sinks/null_sink.h"
#include "spdlog/sinks/stdout_sinks.h"

namespace asyncps {

absl::StatusOr<std::shared_ptr<spdlog::logger>> MakeLogger(
    const std::string& name, const std::string& level) {
  const spdlog::level::level_enum lvl = spdlog::level::from_str(level);
  // from_str maps unknown names to "off"; only "off" itself may mean off.
  if (lvl == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("--log_level: unknown level '", level,
                     "' (want trace|debug|info|warn|error|off)"));
  }
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>(name, sink);
  logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %n %L %v");
  logger->set_level(lvl);
  logger->flush_on(spdlog::level::info);
  return logger;
}

namespace {

// Set once by RouteGrpcLogs before gRPC starts; read on gRPC's threads.
std::shared_ptr<spdlog::logger>* grpc_logger = nullptr;
spdlog::level::level_enum grpc_error_level = spdlog::level::err;
std::atomic<uint64_t> handshake_failures{0};

// Handshake lines come once per refused connection, as fast as anyone
// connects: the first is logged at once, then at most one line per 10 s,
// with the count of those held back.
LogLimiter& HandshakeLines() {
  static LogLimiter* const lines = new LogLimiter(absl::Seconds(10));
  return *lines;
}

// Also the lines of a TLS connection the request guard cut
// (common/request_guard.h): "Corruption detected" and "Decryption error".
bool IsHandshakeLine(const char* file, const char* message) {
  return absl::StrContains(message, "Handshake failed") ||
         absl::StrContains(file, "ssl_transport_security") ||
         absl::StrContains(file, "security_handshaker") ||
         absl::StrContains(file, "secure_endpoint");
}

void LogGrpcLine(gpr_log_func_args* args) {
  const char* file = args->file == nullptr ? "" : args->file;
  const bool error = args->severity == GPR_LOG_SEVERITY_ERROR;
  if (error && absl::StrContains(args->message, "Handshake failed")) {
    handshake_failures.fetch_add(1, std::memory_order_relaxed);
  }
  if (grpc_logger == nullptr || *grpc_logger == nullptr) return;
  const char* slash = std::strrchr(file, '/');
  const char* base = slash == nullptr ? file : slash + 1;
  if (error && IsHandshakeLine(file, args->message)) {
    // One key for them all: their texts name each peer.
    const std::optional<uint64_t> held =
        HandshakeLines().Admit("", Clock::Monotonic()->Now());
    if (!held.has_value()) return;
    (*grpc_logger)
        ->log(grpc_error_level, "grpc: {}:{} {}{}", base, args->line,
              args->message, LogLimiter::HeldBack(*held));
    return;
  }
  (*grpc_logger)
      ->log(error ? grpc_error_level : spdlog::level::debug, "grpc: {}:{} {}",
            base, args->line, args->message);
}

}  // namespace

void RouteGrpcLogs(std::shared_ptr<spdlog::logger> logger,
                   spdlog::level::level_enum error_level) {
  grpc_logger = new std::shared_ptr<spdlog::logger>(std::move(logger));
  grpc_error_level = error_level;
  gpr_set_log_function(&LogGrpcLine);
}

uint64_t GrpcHandshakeFailures() {
  return handshake_failures.load(std::memory_order_relaxed);
}

std::shared_ptr<spdlog::logger> NullLogger() {
  static auto* logger =
      new std::shared_ptr<spdlog::logger>(std::make_shared<spdlog::logger>(
          "null", std::make_shared<spdlog::sinks::null_sink_mt>()));
  return *logger;
}

}  // namespace asyncps
