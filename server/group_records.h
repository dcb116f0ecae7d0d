#ifndef ASYNCPS_SERVER_GROUP_RECORDS_H_
#define ASYNCPS_SERVER_GROUP_RECORDS_H_

// A shard group's records in the run's map (proto/membership.proto) as
// the role code of server/replica_group.h (and psctl status) reads them: a
// replica's id, its place in the group, whether its key is alive, which
// replicas' checkpoints hold the group's last state, and the role's clock.

#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "membership/member_record.h"
#include "proto/membership.pb.h"

namespace asyncps {
namespace group_records {

// ReplicaId of the record: its address and the incarnation there.
inline std::string IdOf(const ReplicaRecord& r) {
  return ReplicaId(r.address(), r.incarnation());
}

// The position of replica `id` in the group, or -1.
inline int Find(const ShardGroupRecord& group, const std::string& id) {
  for (int i = 0; i < group.replicas_size(); ++i) {
    if (IdOf(group.replicas(i)) == id) return i;
  }
  return -1;
}

// Whether the replica's member key exists (`live`: the members' ids).
inline bool IsLive(const absl::flat_hash_set<std::string>& live,
                   const ReplicaRecord& r) {
  return live.contains(IdOf(r));
}

// The replicas the group lists besides `self`.
inline int OthersIn(const ShardGroupRecord& group, const std::string& self) {
  int others = 0;
  for (const ReplicaRecord& r : group.replicas()) others += IdOf(r) != self;
  return others;
}

// Whether a replica besides `self` that holds the group's whole state (a
// caught-up one; the primary is one) is alive. Spares that have not caught
// up hold part of it at most: a group with none but them is lost.
inline bool WholeStateLive(const ShardGroupRecord& group,
                           const absl::flat_hash_set<std::string>& live,
                           const std::string& self) {
  for (const ReplicaRecord& r : group.replicas()) {
    if (IdOf(r) != self && r.caught_up() && IsLive(live, r)) return true;
  }
  return false;
}

// Whether the group names `checkpoint_id` (non-empty) as the checkpoint
// directory of a replica that held its whole state (a caught-up one).
inline bool NamesCheckpoint(const ShardGroupRecord& group,
                            const std::string& checkpoint_id) {
  for (const ReplicaRecord& r : group.replicas()) {
    if (r.caught_up() && !checkpoint_id.empty() &&
        r.checkpoint_id() == checkpoint_id) {
      return true;
    }
  }
  return false;
}

// The addresses of the group's caught-up replicas whose checkpoint
// directories it names: those that held its last state and may bring it
// back (none for a record from before the names, or of replicas that kept
// no checkpoint).
inline std::vector<std::string> NamedHolders(const ShardGroupRecord& group) {
  std::vector<std::string> named;
  for (const ReplicaRecord& r : group.replicas()) {
    if (r.caught_up() && !r.checkpoint_id().empty()) {
      named.push_back(r.address());
    }
  }
  return named;
}

// The role's time is monotonic, as its lease's and its log's are: a step
// of the real-time clock neither drops a backup nor stalls a takeover.
inline absl::Time Now() { return Clock::Monotonic()->Now(); }

}  // namespace group_records
}  // namespace asyncps

#endif  // ASYNCPS_SERVER_GROUP_RECORDS_H_
