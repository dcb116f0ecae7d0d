// --shard_index=auto / --worker_id=auto: StatefulSet ordinals and Indexed
// Job completion indices.
#include "common/identity.h"

#include <catch2/catch.hpp>
#include <optional>
#include <string>

#include "absl/strings/match.h"

namespace asyncps {
namespace {

TEST_CASE("a StatefulSet pod's ordinal comes from its host name",
          "[identity]") {
  CHECK(*OrdinalFromHostname("asyncps-shard-0") == 0);
  CHECK(*OrdinalFromHostname("asyncps-shard-12") == 12);
  CHECK(*OrdinalFromHostname("web-3.asyncps-shard.ns.svc.cluster.local") == 3);
  for (const char* bad : {"asyncps-shard", "shard-x", "-3", "node7", "", "a-1b",
                          "a-+1", "a-99999999999"}) {
    INFO(bad);
    const absl::StatusOr<int> r = OrdinalFromHostname(bad);
    CHECK(absl::IsInvalidArgument(r.status()));
  }
}

TEST_CASE("index flags: numbers as given, auto from the orchestrator",
          "[identity]") {
  const auto host = std::optional<std::string>("asyncps-shard-2");
  const auto index = std::optional<std::string>("5");
  CHECK(*ResolveIndexFlag("shard_index", "4", AutoIndexSource::kHostnameOrdinal,
                          host, index) == 4);
  CHECK(*ResolveIndexFlag("shard_index", "auto",
                          AutoIndexSource::kHostnameOrdinal, host, index) == 2);
  CHECK(*ResolveIndexFlag("worker_id", "auto",
                          AutoIndexSource::kJobCompletionIndex, host,
                          index) == 5);
  absl::StatusOr<int> r = ResolveIndexFlag("worker_id", "auto",
                                           AutoIndexSource::kJobCompletionIndex,
                                           host, std::nullopt);
  REQUIRE_FALSE(r.ok());
  CHECK(absl::StrContains(r.status().message(), "--worker_id=auto"));
  CHECK(absl::StrContains(r.status().message(), "JOB_COMPLETION_INDEX"));
  r = ResolveIndexFlag("shard_index", "auto", AutoIndexSource::kHostnameOrdinal,
                       std::optional<std::string>("laptop"), index);
  REQUIRE_FALSE(r.ok());
  CHECK(absl::StrContains(r.status().message(), "'laptop'"));
  r = ResolveIndexFlag("shard_index", "-1", AutoIndexSource::kHostnameOrdinal,
                       host, index);
  REQUIRE_FALSE(r.ok());
  CHECK(absl::StrContains(r.status().message(), "--shard_index"));
}

}  // namespace
}  // namespace asyncps
