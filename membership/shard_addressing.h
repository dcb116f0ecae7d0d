#ifndef ASYNCPS_MEMBERSHIP_SHARD_ADDRESSING_H_
#define ASYNCPS_MEMBERSHIP_SHARD_ADDRESSING_H_

// How a client program (ps_worker, ps_serve, psctl) finds the shards from
// its flags: a fixed --servers list, or the run's shard map in etcd
// (--etcd_endpoints, --run_id), followed by a MapRouter so that calls move
// with each shard's primary. Both may be given: the counts must agree, and
// the map gives the addresses.
//
// Example (in a main, with the flags' values):
//
//   ShardAddressingOptions a;
//   a.servers = absl::GetFlag(FLAGS_servers);
//   a.etcd_endpoints = absl::GetFlag(FLAGS_etcd_endpoints);
//   a.run_id = absl::GetFlag(FLAGS_run_id);
//   absl::StatusOr<ShardAddressing> shards = ResolveShardAddressing(a);
//   if (!shards.ok()) return Fail(shards.status().message());  // exit 2
//   client_options.servers = shards->servers;
//   client_options.router = shards->router;  // null without etcd

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "membership/map_router.h"

namespace asyncps {

struct ShardAddressingOptions {
  // --servers as given (host:port,...; an address with {i} needs
  // num_shards); "" = none.
  std::string servers;
  int num_shards = 0;  // --num_shards; 0 = as many as listed
  // --etcd_endpoints as given (host:port,...); "" = no etcd.
  std::string etcd_endpoints;
  std::string run_id;  // selects the map: RunPrefix(run_id)
  // How the router waits and logs (wait_for_map: the shards may still be
  // starting).
  MapRouterOptions router;
};

struct ShardAddressing {
  // In shard order: --servers, or the primaries the map names now ("" for
  // a shard without one).
  std::vector<std::string> servers;
  // Follows the map; null without --etcd_endpoints.
  std::shared_ptr<MapRouter> router;
};

// Every error names the flag and what to fix: INVALID_ARGUMENT for bad or
// contradicting flags (neither given, a malformed list, counts that differ
// from the map's), UNAVAILABLE when etcd does not answer, NOT_FOUND when
// the run has no map there. Programs exit 2 on any of them.
absl::StatusOr<ShardAddressing> ResolveShardAddressing(
    const ShardAddressingOptions& options);

}  // namespace asyncps

#endif  // ASYNCPS_MEMBERSHIP_SHARD_ADDRESSING_H_
