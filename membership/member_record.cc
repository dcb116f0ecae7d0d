#include "membership/member_record.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace asyncps {

std::string MembersPrefix(absl::string_view run_prefix) {
  return absl::StrCat(run_prefix, "/members/");
}

std::string ReplicaId(absl::string_view address, uint64_t incarnation) {
  return absl::StrCat(address, "/", absl::Hex(incarnation));
}

absl::string_view ReplicaAddress(absl::string_view id) {
  const size_t slash = id.rfind('/');
  return slash == absl::string_view::npos ? id : id.substr(0, slash);
}

std::string FormatMemberValue(const MemberValue& value) {
  return absl::StrCat(
      "shard=", value.shard < 0 ? "any" : absl::StrCat(value.shard),
      " host=", value.host, value.standby ? " standby" : "");
}

MemberValue ParseMemberValue(absl::string_view text) {
  MemberValue v;
  for (absl::string_view field : absl::StrSplit(text, ' ')) {
    v.standby = v.standby || field == "standby";
    if (absl::ConsumePrefix(&field, "host=")) v.host = std::string(field);
    if (absl::ConsumePrefix(&field, "shard=") &&
        !absl::SimpleAtoi(field, &v.shard)) {
      v.shard = -1;
    }
  }
  return v;
}

}  // namespace asyncps
