// Every method a shard serves, fed random bytes and random protobuf wire
// data (fields of any number and type, nested, truncated), unary and
// streaming, from a fixed seed: the shard never crashes or hangs, never
// answers as if it had a bug (UNKNOWN, INTERNAL, DATA_LOSS), and the run's
// state stays as it was.

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "client/ps_client.h"
#include "tests/testing/cluster_client.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/shard_fuzz.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/tensor_specs.h"

namespace asyncps {
namespace {

using testing::ServerProcess;

constexpr int kElems = 64;

std::vector<float> Read(PsClient* c) {
  std::vector<float> w(kElems);
  REQUIRE_OK(c->StartPull(0, 0, PullSet{{{"w", w.data()}}, {}})->Wait());
  return w;
}

TEST_CASE(
    "random bytes and random protobuf data on every method never crash a "
    "shard, never look like its bug, and change nothing",
    "[bad_input][fuzz]") {
  auto cluster = testing::StartPsCluster(2, {"--num_slots=16"});
  REQUIRE_OK(cluster.status());
  std::unique_ptr<PsClient> c = testing::ClusterClient(*cluster);
  REQUIRE_OK(c->WaitForShards(absl::Seconds(30)));
  REQUIRE_OK(c->Register().status());
  REQUIRE_OK(c->CreateTensors({testing::ConstantSpec(
      "w", {kElems}, 1.0f, testing::SgdSpec(1.0f), 16)}));
  const std::vector<float> before = Read(c.get());
  const uint64_t epoch = c->map().epoch();

  testing::RandomWire input(20261206);
  for (const ServerProcess& shard : *cluster) {
    const std::vector<std::string> bugs =
        testing::FuzzShardMethods(shard.address, &input, 120, 30);
    INFO(absl::StrJoin(bugs, "\n"));
    CHECK(bugs.empty());
    REQUIRE(shard.process->Running());
  }
  CHECK(Read(c.get()) == before);
  CHECK(c->map().epoch() == epoch);
}

}  // namespace
}  // namespace asyncps
