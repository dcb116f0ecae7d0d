#ifndef ASYNCPS_TESTS_REPLICATION_REPLICA_HARNESS_H_
#define ASYNCPS_TESTS_REPLICATION_REPLICA_HARNESS_H_

// Replicas of shard groups as real processes against a real etcd, for the
// replication tests: starting one, waiting for its role and for its
// primary to count its backups, comparing two replicas' state digests, and
// clients that follow the run's map in etcd.
//
// Example:
//
//   absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
//   ServerProcess a = StartReplica(*etcd, "run");
//   WaitForRole(a.address, "primary");
//   ServerProcess b = StartReplica(*etcd, "run");
//   WaitForCounted(a.address, 1);
//   ... push through a ...
//   ExpectSameState(a.address, b.address);

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/ps_client.h"
#include "common/security.h"
#include "proto/asyncps.pb.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace testing {

// ps_server flags of a replica (R = 2) of run `run` (with etcd's TLS
// flags when it serves TLS).
std::vector<std::string> ReplicaArgs(const EtcdProcess& etcd,
                                     const std::string& run);

// A replica of shard `shard` of `num_shards` (the test fails when it does
// not start).
ServerProcess StartReplica(const EtcdProcess& etcd, const std::string& run,
                           const std::vector<std::string>& extra = {},
                           int shard = 0, int num_shards = 1);

// Runs ps_server with `args` until it exits (within 30 s): its exit status
// and log.
std::pair<int, std::string> RunServer(const std::vector<std::string>& args);

// psctl status of run `run` found through etcd (plus `extra` flags),
// within 30 s: its exit status and output.
std::pair<int, std::string> Psctl(const EtcdProcess& etcd,
                                  const std::string& run,
                                  const std::vector<std::string>& extra = {});

// A group of two (R = 2) of run `run`: *primary started and primary,
// then *backup started, backup, and counted by the primary.
void StartReplicaPair(const EtcdProcess& etcd, const std::string& run,
                      ServerProcess* primary, ServerProcess* backup,
                      const std::vector<std::string>& extra = {});

// `security` below: how to reach replicas that serve TLS or need a
// cluster token (default: plain TCP, no token).

// The replica's Status, with its state digest when `digest`.
absl::StatusOr<StatusResponse> ReplicaStatus(
    const std::string& address, bool digest = false,
    const SecurityOptions& security = {});

void WaitForRole(const std::string& address, const std::string& role,
                 absl::Duration timeout = absl::Seconds(20),
                 const SecurityOptions& security = {});

// Until the primary waits for `n` backups and the map calls them caught
// up (they may be promoted).
void WaitForCounted(const std::string& primary, int n,
                    const SecurityOptions& security = {});

// Waits until both replicas stand at the same entry, then compares their
// digests there.
void ExpectSameState(const std::string& a, const std::string& b,
                     const SecurityOptions& security = {});

// Tensor "w": `elems` floats of 1.0, SGD at rate 1, so that each push of
// ones takes exactly 1 off every element (PushOnes, ExpectEvery).
TensorSpec UnitTensor(int elems);
// `n` pushes of ones to "w" (`elems` floats) at steps first_step..., each
// acknowledged (the test fails otherwise).
void PushOnes(PsClient* c, int elems, int first_step, int n);
// Every element of "w" as `c` pulls it at `step` equals `expected`.
void ExpectEvery(PsClient* c, int elems, int64_t step, float expected);

// A client of run `run` that follows its map in etcd (60 s call
// deadline), waited for; registered unless `reader`.
std::unique_ptr<PsClient> MapClient(const EtcdProcess& etcd,
                                    const std::string& run, bool reader = false,
                                    const SecurityOptions& security = {});

}  // namespace testing
}  // namespace asyncps

#endif  // ASYNCPS_TESTS_REPLICATION_REPLICA_HARNESS_H_
