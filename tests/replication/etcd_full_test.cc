// A replicated group whose etcd refuses writes because its database is full
// (past --quota-backend-bytes: etcd's NOSPACE alarm), with real processes
// and a real etcd: leases are still renewed and pushes acknowledged; what
// needs a write (a takeover, a server joining) waits or fails saying what
// the operator must do, once per 10 s rather than at every tick, and psctl
// status names the alarm; once the space is freed the backup takes over
// with every acknowledged push.

#include <signal.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/ps_client.h"
#include "membership/etcd_client.h"
#include "tests/replication/replica_harness.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

using testing::ServerProcess;

constexpr int kElems = 1000;
// What every refusal of a full etcd must say (membership/etcd_client.cc).
constexpr char kWhatToDo[] = "etcdctl compact, defrag, alarm disarm";

int Lines(const std::string& log, absl::string_view what) {
  int n = 0;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    n += absl::StrContains(line, what);
  }
  return n;
}

TEST_CASE(
    "etcd's database full: the group keeps acknowledging, a takeover waits "
    "until etcd takes writes again and says why once per 10 s",
    "[replication][etcd]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd =
      testing::StartEtcd(absl::Seconds(30), {"--quota-backend-bytes=16777216"});
  REQUIRE_OK(etcd.status());
  const std::string run = "full";
  ServerProcess a, b;
  testing::StartReplicaPair(*etcd, run, &a, &b);
  std::unique_ptr<PsClient> c = testing::MapClient(*etcd, run);
  REQUIRE_OK(c->CreateTensors({testing::UnitTensor(kElems)}));
  testing::PushOnes(c.get(), kElems, 0, 10);

  // Fill etcd until it refuses writes.
  EtcdClientOptions eo;
  eo.endpoints = {etcd->endpoint};
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Connect(eo);
  REQUIRE_OK(client.status());
  const std::string mib(1 << 20, 'x');
  absl::Status put;
  for (int i = 0; i < 64 && put.ok(); ++i) {
    put = (*client)->Put(absl::StrCat("/junk/", i), mib).status();
  }
  INFO(put.ToString());
  REQUIRE(absl::IsResourceExhausted(put));
  CHECK(absl::StrContains(put.message(), kWhatToDo));
  absl::StatusOr<int64_t> lease = (*client)->GrantLease(absl::Seconds(5));
  REQUIRE(absl::IsResourceExhausted(lease.status()));
  CHECK(absl::StrContains(lease.status().message(), kWhatToDo));

  // Leases are renewed without writes: the group goes on. psctl status
  // says why nothing that needs a write can happen, and fails.
  testing::PushOnes(c.get(), kElems, 10, 10);
  {
    auto [exit, out] = testing::Psctl(*etcd, run);
    INFO(out);
    CHECK(exit != 0);
    CHECK(absl::StrContains(out, "etcd: alarm NOSPACE raised by member"));
    CHECK(absl::StrContains(out, kWhatToDo));
    std::tie(exit, out) = testing::Psctl(*etcd, run, {"-o", "json"});
    CHECK(exit != 0);
    CHECK(absl::StrContains(out, "\"etcd_alarms\":[{\"alarm\":\"NOSPACE\""));
  }

  // The primary dies: its backup cannot write the map that makes it the
  // primary. A server started meanwhile gets no lease and exits 2.
  REQUIRE_OK(a.process->Signal(SIGKILL));
  (void)a.process->Wait(absl::Seconds(10));
  std::pair<int, std::string> newcomer;
  std::thread start([&] {
    std::vector<std::string> args = testing::ReplicaArgs(*etcd, run);
    args.push_back("--shard_index=0");
    args.push_back("--num_shards=1");
    newcomer = testing::RunServer(args);
  });
  absl::SleepFor(absl::Seconds(5));
  start.join();
  {
    INFO("the newcomer's log:\n" << newcomer.second);
    CHECK(newcomer.first == 2);
    CHECK(absl::StrContains(newcomer.second, "granted no lease"));
    CHECK(absl::StrContains(newcomer.second, kWhatToDo));
    CHECK_FALSE(absl::StrContains(newcomer.second, "cannot reach etcd"));
  }
  absl::StatusOr<StatusResponse> sb = testing::ReplicaStatus(b.address);
  REQUIRE_OK(sb.status());
  CHECK(sb->replica().role() == "backup");
  // It tried at every tick (about 40 times since the lease ran out) and
  // said so once (twice if this machine stalled the test past 10 s).
  const std::string log = b.process->ReadLog();
  INFO("the backup's log:\n" << log);
  const int lines = Lines(log, "did not take over shard 0");
  CHECK(lines >= 1);
  CHECK(lines <= 2);
  CHECK(Lines(log, kWhatToDo) == lines);

  // The operator frees the space: the backup takes over with every push.
  REQUIRE_OK(testing::EtcdFreeSpace(*etcd));
  testing::WaitForRole(b.address, "primary");
  {
    auto [exit, out] = testing::Psctl(*etcd, run, {"-o", "json"});
    INFO(out);
    CHECK(absl::StrContains(out, "\"etcd_alarms\":[]"));
  }
  testing::PushOnes(c.get(), kElems, 20, 10);
  testing::ExpectEvery(c.get(), kElems, 30, 1.0f - 30);
}

}  // namespace
}  // namespace asyncps
