#ifndef ASYNCPS_SERVER_REPLICA_SETUP_H_
#define ASYNCPS_SERVER_REPLICA_SETUP_H_

// ps_server's replication flags turned into a shard group membership
// (server/replica_group.h) and the server options it implies.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/reserved_port.h"
#include "common/security.h"
#include "server/ps_server.h"
#include "server/replica_group.h"

namespace asyncps {

// --shard_index=any (PsServerOptions::store.shard_index): a spare replica
// of whichever group has a live primary and fewer than R replicas, chosen
// when it joins.
inline constexpr int kAnyShard = -1;

struct ReplicaFlags {
  int replicas = 1;                         // --replicas
  std::vector<std::string> etcd_endpoints;  // --etcd_endpoints
  EtcdAccess etcd_access;  // --etcd_ca, --etcd_cert, --etcd_key, --etcd_user
  absl::Duration lease = absl::Seconds(1);  // --lease_ms
  std::string host_label;                   // --host_label / ASYNCPS_HOST
  absl::Duration replica_timeout;           // --replica_timeout_ms
  bool claim_without_checkpoint = false;    // --claim_without_checkpoint
  // --replication_log_mib; the log's own default.
  int64_t log_mib =
      static_cast<int64_t>(ReplicationLog::Options().max_bytes >> 20);
};

// What the process does for its group while it joins.
struct ReplicaHooks {
  // Asked while it waits (standing by, for a takeover): true ends the
  // join with CANCELLED (SIGTERM). Null: never.
  std::function<bool()> stopping;
  // For a spare of any shard: locks the files of the shard it chose in
  // --checkpoint_dir before it writes any (an error ends the join). Null:
  // nothing to lock.
  std::function<absl::Status(int shard)> lock_shard_files;
};

// ps_server's replication flags (--replicas, --etcd_*, --lease_ms,
// --host_label, --replica_timeout_ms, --replication_log_mib,
// --claim_without_checkpoint), defined
// here; etcd's warnings are logged with `options`' logger, and the error
// names the flag (CheckReplicaFlags included).
absl::StatusOr<ReplicaFlags> ReplicaFlagsFromFlags(
    const PsServerOptions& options);

// INVALID_ARGUMENT (the message says what to fix) for --shard_index=any
// with R < 2, R < 1, R > 1 without
// etcd, etcd without --run_id, a lease under one second, or a log bound
// outside [1, 1048576] MiB.
absl::Status CheckReplicaFlags(const ReplicaFlags& flags,
                               const PsServerOptions& options);

// Null when the shard is not replicated (no etcd). Otherwise joins the
// group and fits `options`: the advertised address (when --port is 0, a
// port the OS chose, held in *reserved until the caller starts the server
// on it), the log, the Status hook, and for a spare the
// snapshot to restore and its shard epoch (in --checkpoint_dir, or in a
// new temporary directory named in *temp_dir, which the caller removes).
// `hooks` go to the group (ReplicaGroupOptions::stopping and
// lock_shard_files).
absl::StatusOr<std::unique_ptr<ReplicaGroup>> SetUpReplica(
    const ReplicaFlags& flags, PsServerOptions* options, std::string* temp_dir,
    ReplicaHooks hooks, ReservedPort* reserved);

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_REPLICA_SETUP_H_
