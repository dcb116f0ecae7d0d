// psctl status --digests: replicas at one log entry must hold one digest;
// a difference there is a problem line, replicas at different entries are
// not compared, and a replica that did not answer is shown, not compared.
#include "tools/replica_digests.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace asyncps {
namespace {

ReplicaDigest At(int shard, const std::string& address, uint64_t entry,
                 uint64_t digest) {
  ReplicaDigest d;
  d.shard = shard;
  d.address = address;
  d.role = "backup";
  d.log_index = entry;
  d.digest = digest;
  return d;
}

TEST_CASE("replicas at one entry with different digests are a problem") {
  std::vector<ReplicaDigest> d = {At(0, "a:1", 812, 0xabc),
                                  At(0, "b:1", 812, 0xabc),
                                  At(1, "c:1", 90, 0x1), At(1, "d:1", 91, 0x2)};
  CHECK(DigestProblems(d).empty());  // shard 1's are at different entries
  d.push_back(At(0, "e:1", 812, 0xabd));
  const std::vector<std::string> problems = DigestProblems(d);
  REQUIRE(problems.size() == 1);
  CHECK(problems[0] ==
        "shard 0: replicas at entry 812 differ: a:1 0000000000000abc against "
        "e:1 0000000000000abd");
  const std::string text = DigestsText(d);
  CHECK(text.find("0000000000000abd") != std::string::npos);
  CHECK(text.find("WARNING: shard 0: replicas at entry 812 differ") !=
        std::string::npos);
}

TEST_CASE("a replica that did not answer is shown down and not compared") {
  ReplicaDigest down;
  down.shard = 0;
  down.address = "b:1";
  down.error = "14: connection refused";
  const std::vector<ReplicaDigest> d = {At(0, "a:1", 5, 0x7), down};
  CHECK(DigestProblems(d).empty());
  const std::string text = DigestsText(d);
  CHECK(text.find("DOWN") != std::string::npos);
  CHECK(text.find("connection refused") != std::string::npos);
}

}  // namespace
}  // namespace asyncps
