#ifndef ASYNCPS_TOOLS_REPLICA_DIGESTS_H_
#define ASYNCPS_TOOLS_REPLICA_DIGESTS_H_

// psctl status --digests: the state digest of every replica of a replicated
// run (ReplicaStatus.state_digest: values, versions, optimizer state, rows,
// worker records, de-duplication windows), read from each primary and from
// every backup its group lists, so that an operator sees whether the
// replicas hold the same state. Replicas at the same log entry must hold
// equal digests; two that differ there are a problem line (exit 1).
// Replicas at different entries (a backup behind under load) are not
// compared.
//
//   psctl status --etcd_endpoints=h:p --run_id=R --digests

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/security.h"
#include "tools/doc.h"
#include "tools/status_table.h"

namespace asyncps {

struct ReplicaDigest {
  int shard = 0;
  std::string address;
  std::string role;  // as the replica says; "" when it did not answer
  uint64_t log_index = 0;
  uint64_t digest = 0;
  std::string error;  // when it did not answer
};

// The digests of the replicas of `primaries` (Status answers asked with
// state_digest; shards without replica status are skipped): each primary's
// own, and each backup's asked directly, all within `timeout`.
std::vector<ReplicaDigest> GatherDigests(
    const std::vector<ShardResult>& primaries, const SecurityOptions& security,
    absl::Duration timeout);

// "shard 0: replicas at entry 812 differ: h:p 0x.. against h:p 0x.." for
// every pair at one entry with different digests.
std::vector<std::string> DigestProblems(
    const std::vector<ReplicaDigest>& digests);

// A table (SHARD ROLE ADDRESS ENTRY DIGEST), and the same as a document.
std::string DigestsText(const std::vector<ReplicaDigest>& digests);
Doc DigestsDoc(const std::vector<ReplicaDigest>& digests);

}  // namespace asyncps

#endif  // ASYNCPS_TOOLS_REPLICA_DIGESTS_H_
