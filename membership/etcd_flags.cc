#include "membership/etcd_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, etcd_endpoints, "",
          "etcd host:port,... holding the shard map of --run_id (a "
          "replicated run, under /asyncps/<run_id>). ps_server: registers "
          "there with a lease and takes its place in its shard's group "
          "(needed by --replicas > 1). Clients: the shards and their "
          "primaries come from the map, followed through failovers; "
          "--servers is then optional (if given, its count must match the "
          "map's).");

namespace asyncps {

std::string EtcdEndpointsFlag() { return absl::GetFlag(FLAGS_etcd_endpoints); }

}  // namespace asyncps
