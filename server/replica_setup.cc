#include "server/replica_setup.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/identity.h"
#include "membership/map_store.h"
#include "server/checkpoint.h"
#include "server/etcd_map_record.h"
#include "server/spec_file.h"

namespace asyncps {

namespace {

// A port the OS calls free on `host` now (the server binds it next).
absl::StatusOr<int> FreePort(const std::string& host) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket() failed");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    a.sin_addr.s_addr = htonl(INADDR_ANY);
  }
  socklen_t len = sizeof(a);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  close(fd);
  if (!ok) return absl::UnavailableError("cannot find a free port on " + host);
  return static_cast<int>(ntohs(a.sin_port));
}

}  // namespace

absl::Status CheckReplicaFlags(const ReplicaFlags& flags,
                               const PsServerOptions& options) {
  if (flags.replicas < 1 || flags.replicas > 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("--replicas must be in [1, 16], got ", flags.replicas));
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
    std::function<bool()> stopping) {
  if (flags.etcd_endpoints.empty()) return nullptr;
  if (o->port == 0) {
    absl::StatusOr<int> port = FreePort(o->host);
    if (!port.ok()) return port.status();
    o->port = *port;
  }
  if (o->advertise_address.empty()) {
    const std::string host = o->host == "0.0.0.0" || o->host == "::"
                                 ? CurrentHostname().value_or("localhost")
                                 : o->host;
    o->advertise_address = absl::StrCat(host, ":", o->port);
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
  g.stopping = std::move(stopping);
  // A spare's old spec file must not add to the snapshot it restores.
  const std::string specs =
      SpecFilePath(dir, o->store.shard_index, o->store.num_shards);
  absl::StatusOr<std::unique_ptr<ReplicaGroup>> group =
      ReplicaGroup::Join(std::move(g));
  if (!group.ok()) return group.status();
  if (!(*group)->claimed()) {
    std::remove(specs.c_str());
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

}  // namespace asyncps
