#ifndef ASYNCPS_TESTS_TESTING_SHARD_MAPS_H_
#define ASYNCPS_TESTS_TESTING_SHARD_MAPS_H_

// Shard maps (proto/membership.proto) and etcd clients that the membership
// tests build over and over.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "membership/etcd_client.h"
#include "proto/membership.pb.h"
#include "tests/testing/etcd_process.h"

namespace asyncps {
namespace testing {

// A client of the test's etcd (`o` with its endpoint).
inline absl::StatusOr<std::shared_ptr<EtcdClient>> ConnectToEtcd(
    const EtcdProcess& etcd, EtcdClientOptions o = {}) {
  o.endpoints = {etcd.endpoint};
  absl::StatusOr<std::unique_ptr<EtcdClient>> c = EtcdClient::Connect(o);
  if (!c.ok()) return c.status();
  return std::shared_ptr<EtcdClient>(*std::move(c));
}

// Run `run`'s map of two shards of R = 2, every replica caught up: shard s
// on 10.0.0.<2s>:7000 (primary, host0) and 10.0.0.<2s+1>:7000 (host1).
inline ShardMapRecord TwoByTwoMap(const std::string& run) {
  ShardMapRecord m;
  m.set_run_id(run);
  m.set_num_shards(2);
  m.set_replicas(2);
  for (int s = 0; s < 2; ++s) {
    ShardGroupRecord* g = m.add_groups();
    g->set_shard(s);
    for (int r = 0; r < 2; ++r) {
      ReplicaRecord* rep = g->add_replicas();
      rep->set_address(absl::StrCat("10.0.0.", s * 2 + r, ":7000"));
      rep->set_host(absl::StrCat("host", r));
      rep->set_caught_up(true);
    }
  }
  return m;
}

// Run `run`'s map of one shard held by `addresses` (the primary first).
inline ShardMapRecord OneShardMap(const std::string& run,
                                  const std::vector<std::string>& addresses) {
  ShardMapRecord m;
  m.set_run_id(run);
  m.set_num_shards(1);
  m.set_replicas(static_cast<int>(addresses.size()));
  ShardGroupRecord* g = m.add_groups();
  for (const std::string& a : addresses) g->add_replicas()->set_address(a);
  return m;
}

}  // namespace testing
}  // namespace asyncps

#endif  // ASYNCPS_TESTS_TESTING_SHARD_MAPS_H_
