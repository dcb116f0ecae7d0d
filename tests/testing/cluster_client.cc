#include "tests/testing/cluster_client.h"

#include <catch2/catch.hpp>
#include <utility>

#include "tests/testing/require_ok.h"

namespace asyncps {
namespace testing {

std::unique_ptr<PsClient> ClusterClient(
    const std::vector<ServerProcess>& cluster) {
  PsClientOptions o;
  for (const ServerProcess& s : cluster) o.servers.push_back(s.address);
  o.retry.call_deadline = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<PsClient>> c = PsClient::Connect(o);
  REQUIRE_OK(c.status());
  return *std::move(c);
}

}  // namespace testing
}  // namespace asyncps
