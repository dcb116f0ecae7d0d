#ifndef ASYNCPS_MEMBERSHIP_MEMBER_RECORD_H_
#define ASYNCPS_MEMBERSHIP_MEMBER_RECORD_H_

// A server process in a replicated run, as etcd holds it: its key
// `<prefix>/members/<id>` under its lease, where the id is
// "<address>/<incarnation in hex>" (a process restarted at the same address
// is another replica), and the key's value "shard=N host=H", with
// " standby" while it waits for a place in a group. Written by the process
// (server/replica_group.h), read by psctl status.
//
//   MemberValue v{.shard = 0, .host = "node-3", .standby = true};
//   etcd->Put(key, FormatMemberValue(v), lease);   // "shard=0 host=node-3
//   standby"

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace asyncps {

// "<run_prefix>/members/": the members' keys are this and their ids.
std::string MembersPrefix(absl::string_view run_prefix);

std::string ReplicaId(absl::string_view address, uint64_t incarnation);
// The address part of a ReplicaId.
absl::string_view ReplicaAddress(absl::string_view id);

struct MemberValue {
  int shard = -1;    // its group; -1: any (ps_server --shard_index=any)
  std::string host;  // its placement label
  bool standby = false;
};
std::string FormatMemberValue(const MemberValue& value);
// Fields it does not know are skipped; a shard that is no number reads -1.
MemberValue ParseMemberValue(absl::string_view text);

}  // namespace asyncps

#endif  // ASYNCPS_MEMBERSHIP_MEMBER_RECORD_H_
