#include "server/replica_setup.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/identity.h"
#include "membership/etcd_flags.h"
#include "membership/map_store.h"
#include "server/checkpoint.h"
#include "server/checkpoint_dir_id.h"
#include "server/etcd_map_record.h"
#include "server/spec_file.h"

ABSL_FLAG(int, replicas, 1,
          "R: server processes per shard (a primary and R-1 backups, each "
          "started with the same --shard_index). R > 1 needs "
          "--etcd_endpoints; 1 = today's unreplicated shard.");
ABSL_FLAG(int64_t, lease_ms, 1000,
          "The process's lease in etcd (whole seconds, >= 1000): a primary "
          "whose lease lapses is replaced by a caught-up backup.");
ABSL_FLAG(std::string, host_label, "",
          "Placement label of this process (replicas of one shard should "
          "differ; on Kubernetes, the node's name); default: the machine's "
          "name.");
ABSL_FLAG(int64_t, replica_timeout_ms, 0,
          "A backup that acknowledges nothing for this long while entries "
          "wait is dropped from the map; 0 = twice --lease_ms.");
ABSL_FLAG(bool, claim_without_checkpoint, false,
          "With --replicas >= 2: let this process claim a shard group that "
          "held a state though it has no checkpoint of the group's last "
          "state: none of the shard at all (no --checkpoint_dir, none of "
          "this shard's files there, or --restore=false; the shard starts "
          "anew, its state lost), or an older one than the caught-up "
          "replicas the group listed when it was lost (what the group "
          "applied since is lost). Without it such a process waits for one "
          "of those (e.g. a standby with an empty disk after the group's "
          "replicas were lost at once, or a replica dropped long before the "
          "group's last one).");
ABSL_FLAG(int64_t, replication_log_mib, asyncps::ReplicaFlags().log_mib,
          "Entries each replica's log keeps for backups that reconnect or "
          "lag, in MiB (oldest dropped first; a backup that needs a dropped "
          "entry starts over from a snapshot). A spare catching up needs the "
          "entries since its snapshot's cut: those are kept up to 1 GiB or "
          "4x this, whichever is more. Range [1, 1048576].");

namespace asyncps {

absl::Status CheckReplicaFlags(const ReplicaFlags& flags,
                               const PsServerOptions& options) {
  if (flags.replicas < 1 || flags.replicas > 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("--replicas must be in [1, 16], got ", flags.replicas));
  }
  if (options.store.shard_index == kAnyShard && flags.replicas < 2) {
    return absl::InvalidArgumentError(
        "--shard_index=any (a spare replica of whichever shard group needs "
        "one) needs --replicas=2 or more and --etcd_endpoints: a group of "
        "one process has nobody to copy its state from");
  }
  if (flags.host_label.size() > 253 ||
      !std::all_of(flags.host_label.begin(), flags.host_label.end(),
                   [](char c) { return c > ' ' && c < 0x7f; })) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--host_label must be a host or node name (up to 253 printable "
        "characters, no spaces), got '",
        absl::CHexEscape(flags.host_label.substr(0, 64)),
        flags.host_label.size() > 64 ? "...'" : "'"));
  }
  if (flags.log_mib < 1 || flags.log_mib > (int64_t{1} << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--replication_log_mib must be in [1, 1048576], got ", flags.log_mib));
  }
  if (flags.etcd_endpoints.empty()) {
    if (flags.replicas > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--replicas=", flags.replicas,
          " needs --etcd_endpoints: the shard map and the replicas' leases "
          "live in etcd (start one, e.g. deploy/local.sh --replicas 2 does)"));
    }
    return absl::OkStatus();
  }
  if (options.run_id.empty()) {
    return absl::InvalidArgumentError(
        "--etcd_endpoints needs --run_id: the run's shard map lives under "
        "/asyncps/<run_id> in etcd");
  }
  if (flags.lease < absl::Seconds(1)) {
    return absl::InvalidArgumentError(
        "--lease_ms must be >= 1000 (etcd leases are whole seconds)");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ReplicaGroup>> SetUpReplica(
    const ReplicaFlags& flags, PsServerOptions* o, std::string* temp_dir,
    ReplicaHooks hooks, ReservedPort* reserved) {
  if (flags.etcd_endpoints.empty()) return nullptr;
  if (o->port == 0) {
    // Advertised in etcd now, listened on only once the process joined
    // (a standby may wait for hours): held until then.
    absl::StatusOr<ReservedPort> port = ReservedPort::Pick(o->host);
    if (!port.ok()) return port.status();
    *reserved = *std::move(port);
    o->port = reserved->port();
  }
  if (o->advertise_address.empty()) {
    const std::string host = o->host == "0.0.0.0" || o->host == "::"
                                 ? CurrentHostname().value_or("localhost")
                                 : o->host;
    o->advertise_address = absl::StrCat(host, ":", o->port);
  }
  // What it has to restore, should it claim a group that held a state:
  // checked when it decides (a process of any shard learns its shard then).
  std::function<bool(int)> has_checkpoint;
  std::string checkpoint_id;
  if (o->restore && !o->checkpoint_dir.empty()) {
    has_checkpoint = [fs = o->fs, dir = o->checkpoint_dir,
                      n = o->store.num_shards](int shard) {
      return fs->Stat(CheckpointPath(dir, shard, n)).ok();
    };
  }
  if (!o->checkpoint_dir.empty()) {
    absl::StatusOr<std::string> id = CheckpointDirId(o->checkpoint_dir, o->fs);
    if (!id.ok()) return id.status();
    checkpoint_id = *std::move(id);
  }
  std::string dir = o->checkpoint_dir;
  if (dir.empty()) {
    // Under $TMPDIR when set (removed at a clean exit; a killed process
    // leaves it to whoever owns that directory).
    const char* env = std::getenv("TMPDIR");
    std::string pattern =
        absl::StrCat(env != nullptr && *env != '\0' ? env : "/tmp",
                     "/asyncps-replica-XXXXXX");
    if (mkdtemp(pattern.data()) == nullptr) {
      return absl::InternalError(
          absl::StrCat("cannot create a temporary directory ", pattern));
    }
    dir = *temp_dir = pattern;
  }
  // A spare writes the snapshot it receives here before the checkpointer
  // (which creates its directory) starts.
  if (absl::Status made = o->fs->CreateDirs(dir); !made.ok()) return made;
  ReplicaGroupOptions g;
  g.etcd_endpoints = flags.etcd_endpoints;
  g.etcd_access = flags.etcd_access;
  g.lease = flags.lease;
  g.run_id = o->run_id;
  g.shard_index = o->store.shard_index;
  g.num_shards = o->store.num_shards;
  g.replicas = flags.replicas;
  g.host = flags.host_label.empty() ? CurrentHostname().value_or("localhost")
                                    : flags.host_label;
  g.address = o->advertise_address;
  g.replica_timeout = flags.replica_timeout > absl::ZeroDuration()
                          ? flags.replica_timeout
                          : 2 * flags.lease;
  g.log_bytes = static_cast<uint64_t>(flags.log_mib) << 20;
  g.snapshot_dir = dir;
  g.fs = o->fs;
  g.security = PeerSecurity(o->security);
  g.logger = o->logger;
  g.stopping = std::move(hooks.stopping);
  g.lock_shard_files = std::move(hooks.lock_shard_files);
  g.has_checkpoint = std::move(has_checkpoint);
  g.checkpoint_id = std::move(checkpoint_id);
  g.claim_without_checkpoint = flags.claim_without_checkpoint;
  absl::StatusOr<std::unique_ptr<ReplicaGroup>> group =
      ReplicaGroup::Join(std::move(g));
  if (!group.ok()) return group.status();
  o->store.shard_index = (*group)->shard_index();  // chosen, for any
  if (!(*group)->claimed()) {
    // A spare's old spec file must not add to the snapshot it restores.
    std::remove(
        SpecFilePath(dir, o->store.shard_index, o->store.num_shards).c_str());
    o->checkpoint_dir = dir;
    o->restore = true;
    o->adopt_run.clear();
    o->epoch = (*group)->shard_epoch();
  }
  o->log = (*group)->log();
  ReplicaGroup* raw = group->get();
  o->replica_status = [raw](StatusResponse* r) { raw->FillStatus(r); };
  o->replica_admits = [raw](const std::string& id) { return raw->Admits(id); };
  o->primary_of = [raw](int shard) { return raw->PrimaryOf(shard); };
  o->run_map_record =
      std::make_shared<EtcdMapRecord>(raw->etcd(), RunPrefix(o->run_id));
  return group;
}

absl::StatusOr<ReplicaFlags> ReplicaFlagsFromFlags(const PsServerOptions& o) {
  ReplicaFlags f;
  f.replicas = absl::GetFlag(FLAGS_replicas);
  const std::string etcd = EtcdEndpointsFlag();
  if (!etcd.empty()) {
    f.etcd_endpoints = absl::StrSplit(etcd, ',', absl::SkipWhitespace());
  }
  std::vector<std::string> warnings;
  absl::StatusOr<EtcdAccess> etcd_access = EtcdAccessFlags(&warnings);
  if (!etcd_access.ok()) return etcd_access.status();
  for (const std::string& w : warnings) o.logger->warn("{}", w);
  f.etcd_access = *std::move(etcd_access);
  f.lease = absl::Milliseconds(absl::GetFlag(FLAGS_lease_ms));
  f.host_label = absl::GetFlag(FLAGS_host_label);
  const int64_t timeout = absl::GetFlag(FLAGS_replica_timeout_ms);
  if (timeout < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--replica_timeout_ms must be >= 0, got ", timeout));
  }
  f.replica_timeout = absl::Milliseconds(timeout);
  f.log_mib = absl::GetFlag(FLAGS_replication_log_mib);
  f.claim_without_checkpoint = absl::GetFlag(FLAGS_claim_without_checkpoint);
  absl::Status s = CheckReplicaFlags(f, o);
  if (!s.ok()) return s;
  return f;
}

}  // namespace asyncps
