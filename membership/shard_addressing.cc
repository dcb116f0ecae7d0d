#include "membership/shard_addressing.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/net.h"

namespace asyncps {

absl::StatusOr<ShardAddressing> ResolveShardAddressing(
    const ShardAddressingOptions& options) {
  const bool etcd = !options.etcd_endpoints.empty();
  if (options.servers.empty() && !etcd) {
    return absl::InvalidArgumentError(
        "give --servers (the shards' addresses) or --etcd_endpoints (the "
        "run's shard map in etcd)");
  }
  ShardAddressing out;
  if (!options.servers.empty()) {
    absl::StatusOr<std::vector<std::string>> servers =
        ParseServerList(options.servers, options.num_shards);
    if (!servers.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--servers: ", servers.status().message()));
    }
    out.servers = *std::move(servers);
  }
  if (!etcd) return out;
  absl::StatusOr<std::vector<std::string>> endpoints =
      ParseServerList(options.etcd_endpoints);
  if (!endpoints.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--etcd_endpoints: ", endpoints.status().message()));
  }
  absl::StatusOr<std::shared_ptr<MapRouter>> router =
      MapRouter::Connect(*endpoints, options.run_id, options.router);
  if (!router.ok()) {
    return absl::Status(
        router.status().code(),
        absl::StrCat("--etcd_endpoints: ", router.status().message()));
  }
  out.router = *std::move(router);
  const int listed = !out.servers.empty() ? static_cast<int>(out.servers.size())
                                          : options.num_shards;
  if (listed != 0 && listed != out.router->num_shards()) {
    return absl::InvalidArgumentError(absl::StrCat(
        out.servers.empty() ? "--num_shards is " : "--servers lists ", listed,
        " shards, but the shard map at ", out.router->key(), " has ",
        out.router->num_shards(),
        ": leave --servers out (the map gives the shards) or correct it"));
  }
  out.servers.resize(out.router->num_shards());
  for (int s = 0; s < out.router->num_shards(); ++s) {
    out.servers[s] = out.router->Address(s);
  }
  return out;
}

}  // namespace asyncps
