// Server processes beyond a group's R, with real processes and a real
// etcd: a process started for a shard whose group already lists R
// replicas stands by (registered in etcd, serving nothing, shown by psctl
// status) and joins the group as soon as one replica leaves the map (a
// killed backup leaves it once its address refuses the primary's probe);
// of two standbys exactly one joins; a standby stopped by SIGTERM exits 0
// at once and leaves the run. Spares of any shard: one never stays in a
// group that lost every caught-up replica (before or after its snapshot),
// and joins it once a new process claims it; a standby on --port=0 holds
// its advertised port; a spare killed while it is counted is dropped once
// its address refuses. A standby with nothing to restore never claims a
// group that held a state, nor one with an older checkpoint than the
// group's last state (a spare of any shard that held it claims it back).

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

// Whether another program could listen at `address`'s port on loopback.
bool CanListen(const std::string& address) {
  return testing::LoopbackPortBindable(
      std::stoi(address.substr(address.find(':') + 1)));
}

// Pushes all-ones gradients of "w" (kElems) through `c`, one at a time, on
// a thread of its own, steps from `first` on, until Stop (or a million).
class PushLoop {
 public:
  PushLoop(PsClient* c, int first)
      : acked_(first), thread_([this, c] {
          const std::vector<float> ones(kElems, 1.0f);
          while (!stop_.load() && acked_.load() < 1000000) {
            absl::StatusOr<PushSummary> r =
                c->Push(acked_.load(), {{"w", ones.data()}});
            if (!r.ok()) {
              failed_ = r.status();
              return;
            }
            acked_.fetch_add(1);
          }
        }) {}
  ~PushLoop() { (void)Stop(); }
  // The pushes answered OK (and `first`).
  int acked() const { return acked_.load(); }
  // Ends the loop: OK, or the error that ended it before.
  absl::Status Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return failed_;
  }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int> acked_;
  absl::Status failed_;
  std::thread thread_;  // last: it starts once the others are set
};

// Flags that make a replica checkpoint into `dir` every second.
std::vector<std::string> Checkpointed(const std::string& dir) {
  return {"--checkpoint_dir=" + dir, "--checkpoint_every_s=1"};
}

// Until the replica at `address` has written two more checkpoints (so one
// began after everything it applied until now).
void WaitForTwoCheckpoints(const std::string& address) {
  auto written = [&]() -> uint64_t {
    absl::StatusOr<StatusResponse> s = testing::ReplicaStatus(address);
    return s.ok() ? s->counters().checkpoints_written() : 0;
  };
  const uint64_t before = written();
  REQUIRE_OK(testing::WaitFor([&] { return written() >= before + 2; },
                              absl::Seconds(20), "two more checkpoints"));
}

// Kills `p` with SIGKILL and reaps it.
void Kill(ServerProcess* p) {
  REQUIRE_OK(p->process->Signal(SIGKILL));
  (void)p->process->Wait(absl::Seconds(10));
}

// A replica of run `run` (`shard` "0".."N-1" or "any" of `num_shards`,
// with `extra` flags) on a port chosen here: a standby serves nothing, so
// it writes no port file to wait for. With `health_file`, its health
// listener's port is written there. Returns once its log says `until`
// (polled every millisecond).
ServerProcess StartStandby(const testing::EtcdProcess& etcd,
                           const std::string& run,
                           const std::string& health_file = "",
                           const std::string& shard = "0", int num_shards = 1,
                           const std::vector<std::string>& extra = {},
                           const std::string& until = kStandingBy) {
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
  const absl::Status said = testing::WaitFor(
      [&] { return absl::StrContains(s.process->ReadLog(), until); },
      absl::Seconds(20), until, absl::Milliseconds(1));
  INFO("its log:\n" << s.process->ReadLog());
  REQUIRE_OK(said);
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
  PushLoop pushes(c.get(), 20);
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
  const int at_counted = pushes.acked();
  REQUIRE_OK(testing::WaitFor([&] { return pushes.acked() >= at_counted + 20; },
                              absl::Seconds(30), "pushes after the join"));
  REQUIRE_OK(pushes.Stop());
  REQUIRE_OK(replaced);
  REQUIRE((joined == s1.address || joined == s2.address));
  ServerProcess& other = joined == s1.address ? s2 : s1;
  INFO("the other standby's log:\n" << other.process->ReadLog());
  // Exactly one joined; the group is at R again.
  CHECK(Backups(a.address) == std::vector<std::string>{joined});
  CHECK(other.process->Running());
  testing::ExpectSameState(a.address, joined);
  testing::ExpectEvery(c.get(), kElems, pushes.acked(),
                       1.0f - static_cast<float>(pushes.acked()));
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

TEST_CASE(
    "a spare of any shard whose group loses its primary before the spare "
    "could follow leaves the group and stands by, so that a new process "
    "claims the group; the spare then joins it. A standby started with "
    "--port=0 holds the port it advertises",
    "[replication][standby]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  // A lease of 3 s: the spare sees the stopped primary alive when it joins
  // (and waits 5 s for its snapshot that never comes).
  ServerProcess primary =
      testing::StartReplica(*etcd, "spare-lost", {"--lease_ms=3000"});
  testing::WaitForRole(primary.address, "primary");
  REQUIRE_OK(primary.process->Signal(SIGSTOP));
  ServerProcess spare = StartStandby(*etcd, "spare-lost", "", "any");
  INFO("the spare's log:\n" << spare.process->ReadLog());
  CHECK(absl::StrContains(
      spare.process->ReadLog(),
      "left shard 0's group: its primary " + primary.address + " is gone"));
  {
    // Its record is out of the map: the group lists only the lost primary.
    auto [exit, out] = testing::Psctl(*etcd, "spare-lost", {"-o", "json"});
    INFO(out);
    CHECK(absl::StrContains(
        out, "\"standby_replicas\":[{\"address\":\"" + spare.address));
  }
  // Another spare picks its port: held, though nothing listens there yet.
  ServerProcess picked =
      StartStandby(*etcd, "spare-lost", "", "any", 1, {"--port=0"});
  {
    auto [exit, out] = testing::Psctl(*etcd, "spare-lost");
    INFO(out);
    // The other standby's line: "standby replica: ADDRESS (host ...".
    const std::string tag = "standby replica: ";
    for (size_t at = out.find(tag); at != std::string::npos;
         at = out.find(tag, at + 1)) {
      const size_t begin = at + tag.size();
      const std::string address =
          out.substr(begin, out.find(' ', begin) - begin);
      if (address != spare.address) picked.address = address;
    }
    REQUIRE_FALSE(picked.address.empty());
    INFO("the picked address: " << picked.address);
    CHECK_FALSE(CanListen(picked.address));
  }
  REQUIRE_OK(picked.process->Signal(SIGTERM));
  absl::StatusOr<int> stopped = picked.process->Wait(absl::Seconds(10));
  REQUIRE_OK(stopped.status());
  CHECK(*stopped == 0);
  CHECK(CanListen(picked.address));

  // The primary is lost for good; a new process of shard 0 claims the
  // group (nobody holds its state, nor a checkpoint of it), and the spare
  // joins it.
  REQUIRE_OK(primary.process->Signal(SIGKILL));
  (void)primary.process->Wait(absl::Seconds(10));
  // The lost primary had no checkpoint: its state is gone, and only a
  // process told so starts the shard anew.
  ServerProcess claimer = testing::StartReplica(*etcd, "spare-lost",
                                                {"--claim_without_checkpoint"});
  testing::WaitForRole(claimer.address, "primary");
  testing::WaitForCounted(claimer.address, 1);
  CHECK(Backups(claimer.address) == std::vector<std::string>{spare.address});
  CHECK(absl::StrContains(claimer.process->ReadLog(), "claimed shard 0"));
  CHECK(
      absl::StrContains(spare.process->ReadLog(), "joined shard 0 as a spare"));
  std::unique_ptr<PsClient> c = testing::MapClient(*etcd, "spare-lost");
  REQUIRE_OK(c->CreateTensors({testing::UnitTensor(kElems)}));
  testing::PushOnes(c.get(), kElems, 0, 10);
  testing::ExpectSameState(claimer.address, spare.address);
  auto [exit, out] = testing::Psctl(*etcd, "spare-lost");
  INFO(out);
  CHECK(exit == 0);
  CHECK_FALSE(absl::StrContains(out, "standby replica:"));
}

TEST_CASE(
    "a spare of any shard whose primary dies after sending it the snapshot, "
    "before it caught up, starts over and stands by; it joins the group "
    "once a new process of the shard claims it",
    "[replication][standby]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  ServerProcess primary = testing::StartReplica(*etcd, "spare-early");
  testing::WaitForRole(primary.address, "primary");
  std::unique_ptr<PsClient> c = testing::MapClient(*etcd, "spare-early");
  // 16 MiB of state: the spare restores it after its join line, which
  // gives the kill below time to land before the primary counts it.
  constexpr int kBig = 4 << 20;
  REQUIRE_OK(c->CreateTensors({testing::UnitTensor(kBig)}));
  testing::PushOnes(c.get(), kBig, 0, 2);
  ServerProcess spare = StartStandby(*etcd, "spare-early", "", "any", 1, {},
                                     "joined shard 0 as a spare");
  REQUIRE_OK(primary.process->Signal(SIGKILL));
  (void)primary.process->Wait(absl::Seconds(10));
  INFO("the spare's log:\n" << spare.process->ReadLog());
  REQUIRE_FALSE(absl::StrContains(spare.process->ReadLog(), "caught up"));
  REQUIRE_OK(testing::WaitFor(
      [&] {
        const std::string log = spare.process->ReadLog();
        return absl::StrContains(log, "is gone before this spare caught up") &&
               absl::StrContains(log, "every shard group has its 2 replicas");
      },
      absl::Seconds(20), "the spare to start over and stand by"));
  CHECK_FALSE(absl::StrContains(spare.process->ReadLog(), "took over"));
  CHECK(spare.process->Running());

  ServerProcess claimer = testing::StartReplica(*etcd, "spare-early",
                                                {"--claim_without_checkpoint"});
  testing::WaitForRole(claimer.address, "primary");
  testing::WaitForCounted(claimer.address, 1);
  CHECK(Backups(claimer.address) == std::vector<std::string>{spare.address});
  // The claimed group starts from its own (empty) checkpoint: the tensor
  // is made again, and both replicas apply what is pushed.
  REQUIRE_OK(c->CreateTensors({testing::UnitTensor(kBig)}));
  testing::PushOnes(c.get(), kBig, 0, 2);
  testing::ExpectSameState(claimer.address, spare.address);
}

TEST_CASE(
    "a spare killed while its primary counts it (caught up to within a few "
    "entries, not yet called caught up) is dropped once its address "
    "refuses, not a lease later, and the pushes it held go on",
    "[replication][standby]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  // Leases of 3 s and a backup timeout of 20 s: either would take seconds.
  const std::vector<std::string> slow = {"--lease_ms=3000",
                                         "--replica_timeout_ms=20000"};
  ServerProcess primary = testing::StartReplica(*etcd, "spare-counted", slow);
  testing::WaitForRole(primary.address, "primary");
  std::unique_ptr<PsClient> c = testing::MapClient(*etcd, "spare-counted");
  REQUIRE_OK(c->CreateTensors({testing::UnitTensor(kElems)}));
  PushLoop pushes(c.get(), 0);
  ServerProcess spare = StartStandby(*etcd, "spare-counted", "", "0", 1, slow,
                                     "joined shard 0 as a spare");
  // The primary's Status, every millisecond: once the spare acknowledged
  // its snapshot it is stopped (it acknowledges nothing more), and once the
  // primary counts it (a tick later) it is killed: counted, not caught up,
  // with entries it never acknowledged that the pushes wait for.
  auto spare_state = [&](bool* counted, bool* caught_up) {
    absl::StatusOr<StatusResponse> s = testing::ReplicaStatus(primary.address);
    if (!s.ok()) return false;
    for (const auto& b : s->replica().backups()) {
      if (b.address() != spare.address) continue;
      *counted = b.counted();
      *caught_up = b.caught_up();
      return true;
    }
    return false;
  };
  bool counted = false, caught_up = false;
  REQUIRE_OK(testing::WaitFor([&] { return spare_state(&counted, &caught_up); },
                              absl::Seconds(20), "the spare's acknowledgement",
                              absl::Milliseconds(1)));
  REQUIRE_OK(spare.process->Signal(SIGSTOP));
  REQUIRE_OK(testing::WaitFor(
      [&] { return spare_state(&counted, &caught_up) && counted; },
      absl::Seconds(10), "the primary to count the spare"));
  REQUIRE_OK(spare.process->Signal(SIGKILL));
  (void)spare.process->Wait(absl::Seconds(10));
  const int at_kill = pushes.acked();
  INFO("the primary's log:\n" << primary.process->ReadLog());
  REQUIRE_FALSE(caught_up);
  const absl::Status dropped = testing::WaitFor(
      [&] {
        return absl::StrContains(primary.process->ReadLog(),
                                 "dropped backup " + spare.address);
      },
      absl::Seconds(10), "the primary to drop the spare");
  const absl::Status resumed =
      testing::WaitFor([&] { return pushes.acked() >= at_kill + 20; },
                       absl::Seconds(10), "pushes after the drop");
  REQUIRE_OK(pushes.Stop());
  REQUIRE_OK(dropped);
  REQUIRE_OK(resumed);
  CHECK(absl::StrContains(primary.process->ReadLog(),
                          "its stream ended and nothing listens at its "
                          "address"));
  CHECK(Backups(primary.address).empty());
  testing::ExpectEvery(c.get(), kElems, pushes.acked(),
                       1.0f - static_cast<float>(pushes.acked()));
}

TEST_CASE(
    "a standby with nothing to restore never claims a group whose "
    "replicas were all lost; it waits and joins a replica restarted on its "
    "checkpoint, and --claim_without_checkpoint starts the shard anew",
    "[replication][standby]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  const std::string dir_a = testing::MakeTmpDir("held_a");
  const std::string dir_b = testing::MakeTmpDir("held_b");
  ServerProcess a = testing::StartReplica(*etcd, "held", Checkpointed(dir_a));
  testing::WaitForRole(a.address, "primary");
  ServerProcess b = testing::StartReplica(*etcd, "held", Checkpointed(dir_b));
  testing::WaitForCounted(a.address, 1);
  std::unique_ptr<PsClient> c = testing::MapClient(*etcd, "held");
  REQUIRE_OK(c->CreateTensors({testing::UnitTensor(kElems)}));
  testing::PushOnes(c.get(), kElems, 0, 10);
  ServerProcess standby = StartStandby(*etcd, "held");
  WaitForTwoCheckpoints(a.address);
  WaitForTwoCheckpoints(b.address);
  // Both replicas lost at once.
  Kill(&a);
  Kill(&b);
  const std::string waits = "has no checkpoint of it to restore and waits";
  REQUIRE_OK(testing::WaitFor(
      [&] { return absl::StrContains(standby.process->ReadLog(), waits); },
      absl::Seconds(20), "the standby to wait for a checkpoint"));
  absl::SleepFor(absl::Seconds(2));
  INFO("the standby's log:\n" << standby.process->ReadLog());
  CHECK_FALSE(absl::StrContains(standby.process->ReadLog(), "claimed shard"));
  CHECK_FALSE(testing::ReplicaStatus(standby.address).ok());
  {
    // psctl: the group is down (exit 1), the process waits as a standby.
    auto [exit, out] = testing::Psctl(*etcd, "held");
    INFO(out);
    CHECK(exit != 0);
    CHECK(absl::StrContains(out, "standby replica: " + standby.address +
                                     " (host spare-host) waits to join "
                                     "shard 0\n"));
    CHECK(absl::StrContains(out, "its last state is in the checkpoints of " +
                                     a.address + ", " + b.address + " ("));
  }

  // A replica back on its checkpoint claims the group with every push;
  // the standby joins it.
  ServerProcess back =
      testing::StartReplica(*etcd, "held", Checkpointed(dir_a));
  testing::WaitForRole(back.address, "primary");
  testing::WaitForCounted(back.address, 1);
  CHECK(Backups(back.address) == std::vector<std::string>{standby.address});
  testing::ExpectEvery(c.get(), kElems, 10, 1.0f - 10);
  testing::ExpectSameState(back.address, standby.address);

  // Both lost again; told to, a process with nothing starts the shard anew.
  Kill(&back);
  Kill(&standby);
  ServerProcess anew =
      testing::StartReplica(*etcd, "held", {"--claim_without_checkpoint"});
  testing::WaitForRole(anew.address, "primary");
  CHECK(absl::StrContains(anew.process->ReadLog(),
                          "the state the group held is lost and the shard "
                          "starts anew"));
  std::unique_ptr<PsClient> fresh = testing::MapClient(*etcd, "held");
  absl::StatusOr<ListTensorsResponse> listed = fresh->ListTensors();
  REQUIRE_OK(listed.status());
  CHECK(listed->tensors_size() == 0);
}

TEST_CASE(
    "a lost group is claimed by a replica that held its last state: an "
    "older checkpoint waits for it, a spare of any shard claims its group "
    "back, and --claim_without_checkpoint claims with the older one",
    "[replication][standby]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  const std::string dir_p = testing::MakeTmpDir("last_p");
  const std::string dir_s = testing::MakeTmpDir("last_s");
  auto spare = [&] {
    return StartStandby(*etcd, "last", "", "any", 1, Checkpointed(dir_s),
                        "joined shard 0 as a spare");
  };
  auto shard_process = [&](const std::vector<std::string>& extra,
                           const std::string& until) {
    std::vector<std::string> flags = Checkpointed(dir_p);
    flags.insert(flags.end(), extra.begin(), extra.end());
    return StartStandby(*etcd, "last", "", "0", 1, flags, until);
  };
  // A process of shard 0 and a spare of any shard, which joins it.
  ServerProcess p = testing::StartReplica(*etcd, "last", Checkpointed(dir_p));
  testing::WaitForRole(p.address, "primary");
  {
    // A spare of any shard given the primary's directory: refused before
    // it writes a snapshot over the primary's files.
    std::vector<std::string> args = testing::ReplicaArgs(*etcd, "last");
    for (const char* flag : {"--port=0", "--shard_index=any", "--num_shards=1",
                             "--checkpoint_lock_wait_s=1"}) {
      args.push_back(flag);
    }
    args.push_back("--checkpoint_dir=" + dir_p);
    auto [exit, log] = testing::RunServer(args);
    INFO(log);
    CHECK(exit == 2);
    CHECK(absl::StrContains(
        log, absl::StrCat("the files of shard 0 of 1 in ", dir_p,
                          " are in use by process ", p.process->pid())));
    CHECK(Backups(p.address).empty());
  }
  ServerProcess s = spare();
  testing::WaitForCounted(p.address, 1);
  std::unique_ptr<PsClient> c = testing::MapClient(*etcd, "last");
  REQUIRE_OK(c->CreateTensors({testing::UnitTensor(kElems)}));
  testing::PushOnes(c.get(), kElems, 0, 10);
  WaitForTwoCheckpoints(p.address);

  // The primary lost: the spare serves the group and takes 10 more.
  Kill(&p);
  testing::WaitForRole(s.address, "primary");
  testing::PushOnes(c.get(), kElems, 10, 10);
  WaitForTwoCheckpoints(s.address);
  Kill(&s);

  // The process of shard 0 back on its checkpoint (10 pushes): older than
  // the group's last state (20), it waits.
  const std::string older = "this process's checkpoint is older";
  ServerProcess p2 = shard_process({}, older);
  absl::SleepFor(absl::Seconds(2));
  {
    INFO("its log:\n" << p2.process->ReadLog());
    CHECK(absl::StrContains(
        p2.process->ReadLog(),
        "its last state is in the checkpoints of " + s.address));
    CHECK_FALSE(absl::StrContains(p2.process->ReadLog(), "claimed shard"));
    auto [exit, out] = testing::Psctl(*etcd, "last");
    INFO(out);
    CHECK(exit != 0);
    CHECK(absl::StrContains(out, "standby replica: " + p2.address));
    CHECK(absl::StrContains(out,
                            "shard 0 lost every replica holding its state: "
                            "its last state is in the checkpoints of " +
                                s.address + " ("));
  }

  // The spare back on its directory claims shard 0 again; the waiting
  // process joins it. Every push is there.
  ServerProcess s2 = StartStandby(*etcd, "last", "", "any", 1,
                                  Checkpointed(dir_s), "claimed shard 0");
  testing::WaitForRole(s2.address, "primary");
  testing::WaitForCounted(s2.address, 1);
  CHECK(Backups(s2.address) == std::vector<std::string>{p2.address});
  testing::ExpectEvery(c.get(), kElems, 20, 1.0f - 20);
  testing::ExpectSameState(s2.address, p2.address);
  {
    auto [exit, out] = testing::Psctl(*etcd, "last");
    INFO(out);
    CHECK(exit == 0);
    CHECK_FALSE(absl::StrContains(out, "lost every replica"));
  }

  // Its backup lost, then 10 more pushes and the primary: told to, the
  // process of shard 0 claims with its checkpoint (20 pushes) and says
  // what is lost.
  Kill(&p2);
  REQUIRE_OK(testing::WaitFor([&] { return Backups(s2.address).empty(); },
                              absl::Seconds(20), "the backup dropped"));
  testing::PushOnes(c.get(), kElems, 20, 10);
  WaitForTwoCheckpoints(s2.address);
  Kill(&s2);
  ServerProcess p3 =
      shard_process({"--claim_without_checkpoint"}, "claimed shard 0");
  testing::WaitForRole(p3.address, "primary");
  CHECK(absl::StrContains(
      p3.process->ReadLog(),
      "older than the group's last state, which " + s2.address + " held"));
  std::unique_ptr<PsClient> after = testing::MapClient(*etcd, "last");
  REQUIRE_OK(after->WaitForTensors({"w"}, absl::Seconds(20)));
  testing::ExpectEvery(after.get(), kElems, 30, 1.0f - 20);
}

}  // namespace
}  // namespace asyncps
