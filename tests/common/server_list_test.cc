// ParseServerList: plain lists, {i} patterns expanded by the shard count,
// and the list checked against the count; CheckHostPort.

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/net.h"

namespace asyncps {
namespace {

TEST_CASE("a plain server list", "[net]") {
  absl::StatusOr<std::vector<std::string>> l = ParseServerList(" a:1, b:2 ,");
  REQUIRE(l.ok());
  CHECK(*l == std::vector<std::string>{"a:1", "b:2"});
  CHECK(ParseServerList("a:1,b:2", 2).ok());
  absl::Status wrong = ParseServerList("a:1,b:2", 3).status();
  CHECK(absl::IsInvalidArgument(wrong));
  CHECK(absl::StrContains(wrong.message(), "has 2 address(es)"));
  CHECK(absl::IsInvalidArgument(ParseServerList("a", 0).status()));
  CHECK(absl::IsInvalidArgument(ParseServerList("a:0").status()));
  CHECK(absl::IsInvalidArgument(ParseServerList("").status()));
  CHECK(absl::IsInvalidArgument(ParseServerList("a:1", -1).status()));
}

TEST_CASE("an address is host:port with a printable host", "[net]") {
  CHECK(CheckHostPort("a:1").ok());
  CHECK(CheckHostPort("[::1]:7000").ok());
  CHECK(CheckHostPort("shard-0.asyncps.default.svc:65535").ok());
  for (const char* bad : {"", "a", ":1", "a:", "a:0", "a:65536", "a:x",
                          ":::", "a b:1", "a,b:1", "a\x01:1", "\x7f:1"}) {
    INFO(bad);
    const absl::Status s = CheckHostPort(bad);
    CHECK(absl::IsInvalidArgument(s));
    CHECK(absl::StrContains(s.message(), "is not host:port"));
  }
  // Shown escaped, not raw.
  CHECK(absl::StrContains(CheckHostPort("a\x01:1").message(), "'a\\x01:1'"));
  CHECK(absl::StrContains(ParseServerList("a b:1").status().message(),
                          "server address 'a b:1' is not host:port"));
}

TEST_CASE("{i} stands for one address per shard", "[net]") {
  absl::StatusOr<std::vector<std::string>> l =
      ParseServerList("asyncps-shard-0-{i}.asyncps:7000", 3);
  REQUIRE(l.ok());
  CHECK(*l == std::vector<std::string>{"asyncps-shard-0-0.asyncps:7000",
                                       "asyncps-shard-0-1.asyncps:7000",
                                       "asyncps-shard-0-2.asyncps:7000"});
  absl::Status no_count = ParseServerList("s-{i}:7000").status();
  CHECK(absl::IsInvalidArgument(no_count));
  CHECK(absl::StrContains(no_count.message(), "--num_shards"));
  // A pattern and a plain address together must still make the count.
  CHECK(absl::IsInvalidArgument(ParseServerList("s-{i}:7000,x:1", 2).status()));
  CHECK(absl::IsInvalidArgument(ParseServerList("s-{i}:port", 2).status()));
}

}  // namespace
}  // namespace asyncps
