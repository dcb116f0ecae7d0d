#ifndef ASYNCPS_MEMBERSHIP_ETCD_FLAGS_H_
#define ASYNCPS_MEMBERSHIP_ETCD_FLAGS_H_

// --etcd_endpoints and how to reach etcd there (--etcd_ca, --etcd_cert,
// --etcd_key: TLS, and a client certificate for an etcd that requires one;
// --etcd_user, --etcd_password_file: a user of an etcd with authentication),
// defined once for the programs that find a replicated run's shards in etcd
// (ps_server, ps_worker, ps_serve, psctl; and their ASYNCPS_* environment
// variables, common/cli.h). A binary that links this library has the
// flags; only main() reads them, through the functions below, and hands
// them to ResolveShardAddressing (membership/shard_addressing.h) or the
// shard group (server/replica_setup.h).

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "membership/etcd_client.h"
#include "membership/shard_addressing.h"

namespace asyncps {

// The flag's value: "host:port,..." or "" (no etcd).
std::string EtcdEndpointsFlag();

// The connection to etcd: plain TCP when none of --etcd_ca, --etcd_cert,
// --etcd_key is given, else TLS verified with --etcd_ca (gRPC's default
// roots without it), presenting --etcd_cert/--etcd_key (both or neither);
// as --etcd_user with the password in --etcd_password_file (both or
// neither). INVALID_ARGUMENT naming the flag and file when one is
// unreadable, holds no PEM block or no password, or a certificate or user
// comes without its key or password. A password file other users may read
// adds a line to *warnings (for the caller to log).
absl::StatusOr<EtcdAccess> EtcdAccessFlags(std::vector<std::string>* warnings);

// Both into a client program's `a` (a->etcd_endpoints,
// a->router.etcd_access); errors and warnings as EtcdAccessFlags.
absl::Status AddEtcdFlags(ShardAddressingOptions* a,
                          std::vector<std::string>* warnings);

}  // namespace asyncps

#endif  // ASYNCPS_MEMBERSHIP_ETCD_FLAGS_H_
