#ifndef ASYNCPS_TESTS_TESTING_CLUSTER_CLIENT_H_
#define ASYNCPS_TESTS_TESTING_CLUSTER_CLIENT_H_

// A PsClient of shards a test started (the test fails when it cannot
// connect).
//
// Example:
//
//   auto cluster = testing::StartPsCluster(2);
//   std::unique_ptr<PsClient> c = testing::ClusterClient(*cluster);
//   REQUIRE_OK(c->WaitForShards(absl::Seconds(30)));

#include <memory>
#include <vector>

#include "client/ps_client.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace testing {

// Calls retry for up to 30 s.
std::unique_ptr<PsClient> ClusterClient(
    const std::vector<ServerProcess>& cluster);

}  // namespace testing
}  // namespace asyncps

#endif  // ASYNCPS_TESTS_TESTING_CLUSTER_CLIENT_H_
