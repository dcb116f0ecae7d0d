#include "membership/etcd_flags.h"

#include <utility>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, etcd_endpoints, "",
          "etcd host:port,... holding the shard map of --run_id (a "
          "replicated run, under /asyncps/<run_id>). ps_server: registers "
          "there with a lease and takes its place in its shard's group "
          "(needed by --replicas > 1). Clients: the shards and their "
          "primaries come from the map, followed through failovers; "
          "--servers is then optional (if given, its count must match the "
          "map's).");
ABSL_FLAG(std::string, etcd_ca, "",
          "PEM CA bundle that etcd's certificate (its --cert-file) is "
          "checked with; turns TLS to etcd on.");
ABSL_FLAG(std::string, etcd_cert, "",
          "PEM client certificate presented to etcd (with --etcd_key), for "
          "an etcd started with --client-cert-auth; turns TLS to etcd on.");
ABSL_FLAG(std::string, etcd_key, "", "PEM private key of --etcd_cert.");

namespace asyncps {

std::string EtcdEndpointsFlag() { return absl::GetFlag(FLAGS_etcd_endpoints); }

absl::StatusOr<SecurityOptions> EtcdSecurityFlags() {
  SecurityFlagValues v;
  v.tls_ca = absl::GetFlag(FLAGS_etcd_ca);
  v.tls_cert = absl::GetFlag(FLAGS_etcd_cert);
  v.tls_key = absl::GetFlag(FLAGS_etcd_key);
  v.flag_prefix = "--etcd_";
  return SecurityOptionsFromFlagValues(v, /*server=*/false);
}

absl::Status AddEtcdFlags(ShardAddressingOptions* a) {
  a->etcd_endpoints = EtcdEndpointsFlag();
  absl::StatusOr<SecurityOptions> security = EtcdSecurityFlags();
  if (!security.ok()) return security.status();
  a->router.etcd_security = *std::move(security);
  return absl::OkStatus();
}

}  // namespace asyncps
