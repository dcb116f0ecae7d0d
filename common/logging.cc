#include "common/logging.h"

#include "absl/strings/str_cat.h"
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

std::shared_ptr<spdlog::logger> NullLogger() {
  static auto* logger = new std::shared_ptr<spdlog::logger>(
      std::make_shared<spdlog::logger>(
          "null", std::make_shared<spdlog::sinks::null_sink_mt>()));
  return *logger;
}

}  // namespace asyncps
