// Server processes beyond a group's R, with real processes and a real
// etcd: a process started for a shard whose group already lists R
// replicas stands by (registered in etcd, serving nothing, shown by psctl
// status) and joins the group as soon as one replica leaves the map (a
// killed backup leaves it once its address refuses the primary's probe);
// of two standbys exactly one joins; a standby stopped by SIGTERM exits 0
// at once and leaves the run.

#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/ps_client.h"
#include "common/net.h"
#include "proto/grpc_health_v1.grpc.pb.h"
#include "tests/replication/replica_harness.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

using testing::ServerProcess;

constexpr int kElems = 100;
constexpr char kStandingBy[] = "stands by and joins";

// A replica of run `run` (`shard` "0".."N-1" or "any" of `num_shards`,
// with `extra` flags) on a port chosen here: a standby serves nothing, so
// it writes no port file to wait for. With `health_file`, its health
// listener's port is written there.
ServerProcess StartStandby(const testing::EtcdProcess& etcd,
                           const std::string& run,
                           const std::string& health_file = "",
                           const std::string& shard = "0", int num_shards = 1,
                           const std::vector<std::string>& extra = {}) {
  absl::StatusOr<std::string> address = testing::UnusedLoopbackAddress();
  REQUIRE_OK(address.status());
  std::vector<std::string> args = testing::ReplicaArgs(etcd, run);
  args.push_back(
      absl::StrCat("--port=", address->substr(address->find(':') + 1)));
  args.push_back("--shard_index=" + shard);
  args.push_back(absl::StrCat("--num_shards=", num_shards));
  args.push_back("--host_label=spare-host");
  if (!health_file.empty()) {
    args.push_back("--health_port=0");
    args.push_back("--health_port_file=" + health_file);
  }
  args.insert(args.end(), extra.begin(), extra.end());
  absl::StatusOr<std::unique_ptr<testing::Subprocess>> p =
      testing::Subprocess::Start(
          testing::RunfilePath("server/ps_server"), args,
          testing::UniqueTmpPath("ps_server_standby") + ".log");
  REQUIRE_OK(p.status());
  ServerProcess s;
  s.process = *std::move(p);
  s.address = *address;
  REQUIRE_OK(testing::WaitFor(
      [&] { return absl::StrContains(s.process->ReadLog(), kStandingBy); },
      absl::Seconds(20), "the process to stand by"));
  return s;
}

// The backups the primary at `primary` streams to.
std::vector<std::string> Backups(const std::string& primary) {
  absl::StatusOr<StatusResponse> s = testing::ReplicaStatus(primary);
  REQUIRE_OK(s.status());
  std::vector<std::string> out;
  for (const auto& b : s->replica().backups()) out.push_back(b.address());
  return out;
}

TEST_CASE(
    "processes beyond R stand by and serve nothing; when the backup dies "
    "exactly one of them joins, catches up and is counted, with every "
    "acknowledged push applied once; SIGTERM ends a standby at once",
    "[replication][standby]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  ServerProcess a, b;
  testing::StartReplicaPair(*etcd, "standby", &a, &b);
  std::unique_ptr<PsClient> c = testing::MapClient(*etcd, "standby");
  REQUIRE_OK(c->CreateTensors({testing::UnitTensor(kElems)}));
  testing::PushOnes(c.get(), kElems, 0, 20);

  const std::string health_file = testing::UniqueTmpPath("standby_health");
  ServerProcess s1 = StartStandby(*etcd, "standby", health_file);
  ServerProcess s2 = StartStandby(*etcd, "standby");
  // The group stays at R: the primary streams to its one backup only, and
  // a standby answers nothing.
  CHECK(Backups(a.address) == std::vector<std::string>{b.address});
  CHECK_FALSE(testing::ReplicaStatus(s1.address).ok());
  {
    // Alive for a liveness probe, not ready for a readiness one.
    std::ifstream in(health_file);
    int port = 0;
    in >> port;
    REQUIRE(port > 0);
    auto health = grpc::health::v1::Health::NewStub(
        MakeChannel(absl::StrCat("127.0.0.1:", port)));
    for (const auto& [service, want] :
         std::vector<std::pair<std::string, bool>>{
             {"asyncps.Process", true},
             {"asyncps.ParameterServer", false},
             {"", false}}) {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
      grpc::health::v1::HealthCheckRequest req;
      req.set_service(service);
      grpc::health::v1::HealthCheckResponse resp;
      INFO("health of '" << service << "'");
      REQUIRE(health->Check(&ctx, req, &resp).ok());
      CHECK((resp.status() == grpc::health::v1::HealthCheckResponse::SERVING) ==
            want);
    }
  }
  {
    auto [exit, out] = testing::Psctl(*etcd, "standby");
    INFO(out);
    CHECK(exit == 0);
    for (const ServerProcess* s : {&s1, &s2}) {
      CHECK(absl::StrContains(
          out, absl::StrCat("standby replica: ", s->address,
                            " (host spare-host) waits to join shard 0\n")));
    }
    std::tie(exit, out) = testing::Psctl(*etcd, "standby", {"-o", "json"});
    INFO(out);
    CHECK(exit == 0);
    CHECK(absl::StrContains(out, absl::StrCat("\"address\":\"", s1.address)));
  }

  // Pushes go on while the backup dies and a standby replaces it.
  std::atomic<bool> stop{false};
  std::atomic<int> acked{20};
  absl::Status failed;
  std::thread pushing([&] {
    const std::vector<float> ones(kElems, 1.0f);
    while (!stop.load() && acked.load() < 100000) {
      absl::StatusOr<PushSummary> r =
          c->Push(acked.load(), {{"w", ones.data()}});
      if (!r.ok()) {
        failed = r.status();
        return;
      }
      acked.fetch_add(1);
    }
  });
  REQUIRE_OK(b.process->Signal(SIGKILL));
  (void)b.process->Wait(absl::Seconds(10));
  const absl::Time killed = absl::Now();
  std::string joined, still;
  const absl::Status replaced = testing::WaitFor(
      [&] {
        const std::vector<std::string> now = Backups(a.address);
        if (now.size() != 1 || now[0] == b.address) return false;
        joined = now[0];
        return true;
      },
      absl::Seconds(30), "a standby in the group");
  testing::WaitForCounted(a.address, 1);
  // Dropped as soon as its address refused the primary's probe, not when
  // its lease lapsed.
  INFO("the primary's log:\n" << a.process->ReadLog());
  CHECK(absl::StrContains(a.process->ReadLog(),
                          "its stream ended and nothing listens at its "
                          "address"));
  WARN("a standby was counted " << absl::FormatDuration(absl::Now() - killed)
                                << " after the kill");
  const int at_counted = acked.load();
  REQUIRE_OK(testing::WaitFor([&] { return acked.load() >= at_counted + 20; },
                              absl::Seconds(30), "pushes after the join"));
  stop = true;
  pushing.join();
  REQUIRE_OK(failed);
  REQUIRE_OK(replaced);
  REQUIRE((joined == s1.address || joined == s2.address));
  ServerProcess& other = joined == s1.address ? s2 : s1;
  INFO("the other standby's log:\n" << other.process->ReadLog());
  // Exactly one joined; the group is at R again.
  CHECK(Backups(a.address) == std::vector<std::string>{joined});
  CHECK(other.process->Running());
  testing::ExpectSameState(a.address, joined);
  testing::ExpectEvery(c.get(), kElems, acked.load(),
                       1.0f - static_cast<float>(acked.load()));
  {
    auto [exit, out] = testing::Psctl(*etcd, "standby");
    INFO(out);
    CHECK(exit == 0);
    CHECK(absl::StrContains(out, "standby replica: " + other.address));
    CHECK_FALSE(absl::StrContains(out, "standby replica: " + joined));
  }

  // SIGTERM: the standby exits 0 within a tick and its key goes.
  REQUIRE_OK(other.process->Signal(SIGTERM));
  absl::StatusOr<int> exit = other.process->Wait(absl::Seconds(5));
  REQUIRE_OK(exit.status());
  CHECK(*exit == 0);
  CHECK(
      absl::StrContains(other.process->ReadLog(), "stopped while standing by"));
  auto [code, out] = testing::Psctl(*etcd, "standby");
  INFO(out);
  CHECK(code == 0);
  CHECK_FALSE(absl::StrContains(out, "standby replica:"));
}

TEST_CASE(
    "a spare of any shard stands by beside two whole groups and joins the "
    "one whose backup dies, with its state; any needs R >= 2",
    "[replication][standby]") {
  if (testing::SkipWithoutEtcd()) return;
  {
    auto [exit, log] = testing::RunServer(
        {"--shard_index=any", "--num_shards=2", "--replicas=1"});
    INFO(log);
    CHECK(exit == 2);
    CHECK(absl::StrContains(log, "--shard_index=any"));
    CHECK(absl::StrContains(log, "needs --replicas=2 or more"));
  }
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  // Slices of 10 floats: the tensor spreads over both shards.
  const std::vector<std::string> small = {"--slice_elems=10"};
  std::vector<ServerProcess> primaries, backups;
  for (int shard = 0; shard < 2; ++shard) {
    primaries.push_back(
        testing::StartReplica(*etcd, "spare-any", small, shard, 2));
    testing::WaitForRole(primaries.back().address, "primary");
  }
  for (int shard = 0; shard < 2; ++shard) {
    backups.push_back(
        testing::StartReplica(*etcd, "spare-any", small, shard, 2));
    testing::WaitForCounted(primaries[shard].address, 1);
  }
  std::unique_ptr<PsClient> c = testing::MapClient(*etcd, "spare-any");
  REQUIRE_OK(c->CreateTensors({testing::UnitTensor(kElems)}));
  testing::PushOnes(c.get(), kElems, 0, 10);
  ServerProcess spare = StartStandby(*etcd, "spare-any", "", "any", 2, small);
  CHECK(absl::StrContains(spare.process->ReadLog(),
                          "every shard group has its 2 replicas"));
  {
    auto [exit, out] = testing::Psctl(*etcd, "spare-any");
    INFO(out);
    CHECK(exit == 0);
    CHECK(absl::StrContains(out, "standby replica: " + spare.address +
                                     " (host spare-host) waits to join any "
                                     "shard\n"));
  }
  // Shard 1's backup dies: the spare joins shard 1 (not 0) and catches up.
  REQUIRE_OK(backups[1].process->Signal(SIGKILL));
  (void)backups[1].process->Wait(absl::Seconds(10));
  testing::PushOnes(c.get(), kElems, 10, 10);
  REQUIRE_OK(testing::WaitFor(
      [&] {
        return Backups(primaries[1].address) ==
               std::vector<std::string>{spare.address};
      },
      absl::Seconds(30), "the spare in shard 1's group"));
  testing::WaitForCounted(primaries[1].address, 1);
  INFO("the spare's log:\n" << spare.process->ReadLog());
  CHECK(
      absl::StrContains(spare.process->ReadLog(), "joined shard 1 as a spare"));
  CHECK(Backups(primaries[0].address) ==
        std::vector<std::string>{backups[0].address});
  testing::PushOnes(c.get(), kElems, 20, 10);
  testing::ExpectSameState(primaries[1].address, spare.address);
  testing::ExpectEvery(c.get(), kElems, 30, 1.0f - 30);
  auto [exit, out] = testing::Psctl(*etcd, "spare-any");
  INFO(out);
  CHECK(exit == 0);
  CHECK_FALSE(absl::StrContains(out, "standby replica:"));
}

}  // namespace
}  // namespace asyncps
