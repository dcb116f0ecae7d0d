#ifndef ASYNCPS_MEMBERSHIP_ETCD_FLAGS_H_
#define ASYNCPS_MEMBERSHIP_ETCD_FLAGS_H_

// --etcd_endpoints, defined once for the programs that find a replicated
// run's shards in etcd (ps_server, ps_worker, ps_serve, psctl; and its
// ASYNCPS_* environment variable, common/cli.h). A binary that links this
// library has the flag; only main() reads it, through EtcdEndpointsFlag, and
// hands it to ResolveShardAddressing (membership/shard_addressing.h).

#include <string>

namespace asyncps {

// The flag's value: "host:port,..." or "" (no etcd).
std::string EtcdEndpointsFlag();

}  // namespace asyncps

#endif  // ASYNCPS_MEMBERSHIP_ETCD_FLAGS_H_
