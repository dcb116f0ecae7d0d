// A member's id and value in etcd (membership/member_record.h): what a
// server process writes is what psctl status reads back.
#include "membership/member_record.h"

#include <catch2/catch.hpp>

namespace asyncps {
namespace {

TEST_CASE("a member's value reads back as written, any shard and standby too",
          "[membership]") {
  for (const MemberValue& v :
       {MemberValue{0, "node-3", false}, MemberValue{7, "h", true},
        MemberValue{-1, "spare-host", true}}) {
    const MemberValue back = ParseMemberValue(FormatMemberValue(v));
    CHECK(back.shard == v.shard);
    CHECK(back.host == v.host);
    CHECK(back.standby == v.standby);
  }
  CHECK(FormatMemberValue({2, "n", true}) == "shard=2 host=n standby");
  CHECK(FormatMemberValue({-1, "n", false}) == "shard=any host=n");
  // Unknown fields are skipped; a shard that is no number reads as any.
  const MemberValue odd = ParseMemberValue("zone=x shard=oops host=a b");
  CHECK(odd.shard == -1);
  CHECK(odd.host == "a");
  CHECK_FALSE(odd.standby);
}

TEST_CASE("a replica's id is its address and incarnation", "[membership]") {
  CHECK(ReplicaId("10.0.0.7:7000", 255) == "10.0.0.7:7000/ff");
  CHECK(ReplicaAddress("10.0.0.7:7000/ff") == "10.0.0.7:7000");
  CHECK(ReplicaAddress("[::1]:7000/1") == "[::1]:7000");
  CHECK(ReplicaAddress("no-incarnation") == "no-incarnation");
  CHECK(MembersPrefix("/asyncps/run") == "/asyncps/run/members/");
}

}  // namespace
}  // namespace asyncps
