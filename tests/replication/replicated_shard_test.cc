// Replicated shards with real processes and a real etcd: a shard of two
// server processes (ps_server --replicas=2), pushes from a worker process,
// the backup's state compared with the primary's by digest, the primary
// killed (SIGKILL) or frozen (SIGSTOP) until a backup takes over, and the
// configurations a replica refuses to start with.

#include <signal.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/ps_client.h"
#include "common/net.h"
#include "proto/asyncps.grpc.pb.h"
#include "proto/replication.grpc.pb.h"
#include "tests/faults/harness.h"
#include "tests/replication/replica_harness.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/test_pki.h"

namespace asyncps {
namespace {

using testing::ExpectSameState;
using testing::Psctl;
using testing::ReplicaArgs;
using testing::RunfilePath;
using testing::RunServer;
using testing::ServerProcess;
using testing::ShardStatus;
using testing::StartReplica;
using testing::Subprocess;
using testing::WaitFor;
using testing::WaitForCounted;
using testing::WaitForRole;

constexpr int kElems = 1000;
constexpr float kInit = 1.0f;

std::unique_ptr<PsClient> Client(const std::string& run,
                                 const std::string& address, int worker_id) {
  PsClientOptions o;
  o.servers = {address};
  o.worker_id = worker_id;
  o.run_id = run;
  absl::StatusOr<std::unique_ptr<PsClient>> c = PsClient::Connect(o);
  REQUIRE_OK(c.status());
  return *std::move(c);
}

// w: kElems floats of kInit in slices of 100, SGD at 1.0.
TensorSpec WSpec() {
  TensorSpec spec;
  spec.set_name("w");
  spec.add_shape(kElems);
  spec.set_init(INIT_CONSTANT);
  spec.set_init_value(kInit);
  spec.set_slice_elems(100);
  spec.mutable_optimizer()->set_learning_rate(1.0f);
  return spec;
}

// WSpec's tensor under another name and shape: `elems` floats in slices
// of `slice_elems`.
TensorSpec WSpecOf(const std::string& name, int elems, int slice_elems) {
  TensorSpec spec = WSpec();
  spec.set_name(name);
  spec.clear_shape();
  spec.add_shape(elems);
  spec.set_slice_elems(slice_elems);
  return spec;
}

void CreateTensor(const std::string& run, const std::string& address) {
  REQUIRE_OK(Client(run, address, 900)->CreateTensors({WSpec()}));
}

// A push_client process of run `run`: `pushes` pushes of `grad` by
// `worker_id`.
void Push(const std::string& run, const std::string& address, int worker_id,
          int pushes, int grad) {
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Start(
      RunfilePath("tests/integration/push_client"),
      {absl::StrCat("--servers=", address),
       absl::StrCat("--worker_id=", worker_id),
       absl::StrCat("--pushes=", pushes), absl::StrCat("--grad=", grad),
       "--tensors=w", absl::StrCat("--run_id=", run), "--log_level=warn"});
  REQUIRE_OK(p.status());
  absl::StatusOr<int> exit = (*p)->Wait(absl::Seconds(60));
  REQUIRE_OK(exit.status());
  INFO((*p)->LogTail());
  REQUIRE(*exit == 0);
}

// Every element of w as `address` holds it (a reader's pull).
std::vector<float> Values(const std::string& address) {
  PsClientOptions o;
  o.servers = {address};
  o.reader = true;
  absl::StatusOr<std::unique_ptr<PsClient>> c = PsClient::Connect(o);
  REQUIRE_OK(c.status());
  REQUIRE_OK((*c)->WaitForTensors({"w"}, absl::Seconds(20)));
  std::vector<float> values(kElems, -1e9f);
  REQUIRE_OK((*c)->Pull(0, {{"w", values.data()}}));
  return values;
}

void ExpectAll(const std::vector<float>& values, float expected) {
  int wrong = 0;
  for (float v : values) wrong += v != expected;
  INFO("expected every element " << expected << ", first " << values[0]);
  CHECK(wrong == 0);
}

// Replicas' temporary snapshot directories in `dir`.
int ReplicaTempDirs(const std::string& dir) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    n += entry.is_directory() &&
         absl::StartsWith(entry.path().filename().string(), "asyncps-replica-");
  }
  return n;
}

TEST_CASE(
    "a backup holds every acknowledged push; a killed primary is replaced "
    "with nothing lost; the restarted process catches up",
    "[replication]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  ServerProcess a, b;
  StartReplicaPair(*etcd, "kill", &a, &b);
  // A replica without --checkpoint_dir keeps its snapshots under $TMPDIR
  // (here the test's directory): what a killed one leaves goes with it.
  CHECK(ReplicaTempDirs(testing::TestTmpDir()) >= 2);

  CreateTensor("kill", a.address);
  Push("kill", a.address, 1, 40, 1);
  ExpectAll(Values(a.address), kInit - 40);
  ExpectSameState(a.address, b.address);
  {
    auto [exit, out] = Psctl(*etcd, "kill");
    INFO(out);
    CHECK(exit == 0);
    CHECK(absl::StrContains(out, "primary"));
    CHECK(absl::StrContains(out, "backup"));
  }
  {
    // Both replicas' digests, asked of each: equal at the same entry.
    auto [exit, out] = Psctl(*etcd, "kill", {"--digests", "-o", "json"});
    INFO(out);
    CHECK(exit == 0);
    const std::regex digest("\"digest\":\"([0-9a-f]{16})\"");
    std::vector<std::string> seen;
    for (std::sregex_iterator it(out.begin(), out.end(), digest), end;
         it != end; ++it) {
      seen.push_back((*it)[1]);
    }
    REQUIRE(seen.size() == 2);
    CHECK(seen[0] == seen[1]);
    CHECK(absl::StrContains(out, "\"problems\":[]"));
  }

  const absl::Time killed = absl::Now();
  REQUIRE_OK(a.process->Signal(SIGKILL).ok() ? absl::OkStatus()
                                             : absl::InternalError("kill"));
  (void)a.process->Wait(absl::Seconds(10));
  WaitForRole(b.address, "primary");
  WARN("backup took over " << absl::FormatDuration(absl::Now() - killed)
                           << " after the kill");
  // Not a lease later: the dead primary's address refused the backup's
  // probe while its key was still there.
  CHECK(absl::StrContains(b.process->ReadLog(),
                          "is gone: nothing listens at its address"));
  // Every push the primary acknowledged is on the new primary.
  ExpectAll(Values(b.address), kInit - 40);
  Push("kill", b.address, 2, 10, 1);
  ExpectAll(Values(b.address), kInit - 50);
  {
    // One replica of two: psctl says so and exits non-zero.
    auto [exit, out] = Psctl(*etcd, "kill");
    INFO(out);
    CHECK(exit != 0);
    CHECK(absl::StrContains(out, "has 1 of 2 replicas caught up"));
  }

  // A new process joins as a spare, receives a snapshot and the entries
  // since, and is counted once caught up.
  ServerProcess c = StartReplica(*etcd, "kill");
  WaitForRole(c.address, "backup");
  WaitForCounted(b.address, 1);
  Push("kill", b.address, 3, 5, 2);
  ExpectSameState(b.address, c.address);
  ExpectAll(Values(b.address), kInit - 60);
}

TEST_CASE(
    "replicas of a capped table with a row TTL evict the same rows: the "
    "primary's evictions reach the backup in log order",
    "[replication][eviction]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  // Room for about 2900 rows of dim 8 (SGD: 32 + 64 bytes each); rows
  // unused for 8 steps go too.
  const std::vector<std::string> capped = {"--max_parameter_bytes=300K",
                                           "--row_ttl_steps=8"};
  ServerProcess a, b;
  StartReplicaPair(*etcd, "evict", &a, &b, capped);

  std::unique_ptr<PsClient> c = Client("evict", a.address, 1);
  REQUIRE_OK(c->Register().status());
  TableSpec spec;
  spec.set_name("emb");
  spec.set_dim(8);
  spec.set_init(INIT_UNIFORM);
  spec.set_init_value(0.1f);
  spec.mutable_optimizer()->set_type(OPT_SGD);
  spec.mutable_optimizer()->set_learning_rate(0.125f);
  spec.set_eviction(EVICT_LRU);
  REQUIRE_OK(c->CreateTables({spec}));
  // Each step: 100 hot ids and 600 fresh ones, pulled (created) and pushed;
  // the fresh rows overflow the cap every few steps.
  std::vector<uint64_t> hot;
  for (uint64_t i = 1; i <= 100; ++i) hot.push_back(i * 7919);
  uint64_t fresh = 1u << 30;
  const int steps = 30;
  for (int step = 1; step <= steps; ++step) {
    std::vector<uint64_t> ids = hot;
    for (int i = 0; i < 600; ++i) ids.push_back(fresh++);
    std::vector<float> values(ids.size() * 8);
    auto pull = c->StartPullRows(step, step, {{"emb", ids, values.data()}});
    REQUIRE_OK(pull->Wait());
    const std::vector<float> grads(ids.size() * 8, 1.0f);
    REQUIRE_OK(
        c->StartPushRows(step, {{"emb", ids, grads.data()}}, pull->read())
            ->Wait()
            .status());
  }
  // The primary's sampler evicts the rows idle for 8 steps.
  REQUIRE_OK(WaitFor(
      [&] {
        absl::StatusOr<StatusResponse> s = testing::ReplicaStatus(a.address);
        return s.ok() && s->tables_size() == 1 &&
               s->tables(0).rows_evicted_idle() > 0;
      },
      absl::Seconds(20), "the primary evicts idle rows"));
  ExpectSameState(a.address, b.address);
  absl::StatusOr<StatusResponse> sa = testing::ReplicaStatus(a.address);
  absl::StatusOr<StatusResponse> sb = testing::ReplicaStatus(b.address);
  REQUIRE_OK(sa.status());
  REQUIRE_OK(sb.status());
  REQUIRE(sb->tables_size() == 1);
  const TableStatus& ta = sa->tables(0);
  const TableStatus& tb = sb->tables(0);
  CHECK(ta.rows_evicted_cap() > 0);
  CHECK(tb.rows_evicted_cap() == ta.rows_evicted_cap());
  CHECK(tb.rows_evicted_idle() == ta.rows_evicted_idle());
  CHECK(tb.rows() == ta.rows());
}

TEST_CASE(
    "a frozen primary whose lease lapsed acknowledges nothing once a backup "
    "took over, then rejoins as a spare",
    "[replication]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  ServerProcess a, b;
  StartReplicaPair(*etcd, "freeze", &a, &b);
  CreateTensor("freeze", a.address);
  Push("freeze", a.address, 1, 5, 1);

  REQUIRE_OK(a.process->Signal(SIGSTOP));
  WaitForRole(b.address, "primary");
  REQUIRE_OK(a.process->Signal(SIGCONT));
  // The old primary answers no worker call with OK now: its backup is the
  // primary and acknowledges none of its entries.
  {
    auto stub = ParameterServer::NewStub(MakeChannel(a.address));
    HeartbeatRequest request;
    request.mutable_worker()->set_worker_id(7);
    request.mutable_worker()->set_incarnation(1);
    request.set_run_id("freeze");
    HeartbeatResponse response;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    const grpc::Status s = stub->Heartbeat(&ctx, request, &response);
    INFO(s.error_message());
    CHECK_FALSE(s.ok());
  }
  Push("freeze", b.address, 2, 5, 1);
  ExpectAll(Values(b.address), kInit - 10);
  // The fenced process starts over and follows the new primary.
  WaitForCounted(b.address, 1);
  Push("freeze", b.address, 3, 1, 1);
  absl::StatusOr<StatusResponse> sb = testing::ReplicaStatus(b.address);
  REQUIRE_OK(sb.status());
  REQUIRE(sb->replica().backups_size() == 1);
  ExpectSameState(b.address, sb->replica().backups(0).address());
}

// The number of "acked <step>" lines in a push_client's log.
int Acked(Subprocess* pusher) {
  int n = 0;
  for (absl::string_view line : absl::StrSplit(pusher->ReadLog(), '\n')) {
    n += absl::StartsWith(line, "acked ");
  }
  return n;
}

TEST_CASE(
    "pushes in flight when the primary is killed are applied exactly once, "
    "and the workers never stop",
    "[replication][ledger]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  ServerProcess a, b;
  StartReplicaPair(*etcd, "ledger", &a, &b);
  CreateTensor("ledger", a.address);
  // Three workers that find the primary in the map (and follow it), each
  // pushing its own integer gradient: the sums stay exact in float32.
  constexpr int kPushes = 400;
  std::vector<std::unique_ptr<Subprocess>> pushers;
  for (int w = 0; w < 3; ++w) {
    absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Start(
        RunfilePath("tests/integration/push_client"),
        {absl::StrCat("--etcd_endpoints=", etcd->endpoint), "--run_id=ledger",
         absl::StrCat("--worker_id=", w), absl::StrCat("--pushes=", kPushes),
         absl::StrCat("--grad=", w + 1), "--tensors=w", "--log_level=warn"});
    REQUIRE_OK(p.status());
    pushers.push_back(*std::move(p));
  }
  REQUIRE_OK(WaitFor(
      [&] {
        for (auto& p : pushers) {
          if (Acked(p.get()) < 40) return false;
        }
        return true;
      },
      absl::Seconds(60), "every worker acknowledged 40 pushes"));
  REQUIRE_OK(a.process->Signal(SIGKILL));
  int unfinished = 0;  // workers with pushes to go when the primary died
  for (auto& p : pushers) unfinished += Acked(p.get()) < kPushes;
  REQUIRE(unfinished > 0);
  (void)a.process->Wait(absl::Seconds(10));
  int cut_short = 0;
  for (auto& p : pushers) {
    absl::StatusOr<int> exit = p->Wait(absl::Seconds(120));
    REQUIRE_OK(exit.status());
    INFO(p->LogTail());
    CHECK(*exit == 0);
    CHECK(Acked(p.get()) == kPushes);
    cut_short += Acked(p.get()) < kPushes;
  }
  REQUIRE(cut_short == 0);
  WaitForRole(b.address, "primary");
  // Every acknowledged push once, nothing else: 1 - (1 + 2 + 3) x 400.
  ExpectAll(Values(b.address), kInit - 6 * kPushes);
  // The killed process comes back as a spare and catches up.
  ServerProcess c = StartReplica(*etcd, "ledger");
  WaitForCounted(b.address, 1);
  ExpectSameState(b.address, c.address);
}

TEST_CASE(
    "training workers go on through the failover of a primary they stream "
    "their gradients to",
    "[replication][failover]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  // 2 shards of 2 replicas; the first of each group claims it.
  std::vector<ServerProcess> replicas;
  for (int r = 0; r < 2; ++r) {
    for (int shard = 0; shard < 2; ++shard) {
      absl::StatusOr<ServerProcess> s =
          testing::StartPsServer(shard, 2, ReplicaArgs(*etcd, "train"));
      REQUIRE_OK(s.status());
      replicas.push_back(*std::move(s));
    }
    if (r == 0) {
      for (int shard = 0; shard < 2; ++shard) {
        WaitForRole(replicas[shard].address, "primary");
      }
    }
  }
  for (int shard = 0; shard < 2; ++shard) {
    WaitForCounted(replicas[shard].address, 1);
  }
  // The MLP on Fashion-MNIST: its pushes lend the gradients' memory to the
  // data streams, which a dead primary's ended stream must give back.
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int w = 0; w < 2; ++w) {
    absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Start(
        RunfilePath("worker/ps_worker"),
        {absl::StrCat("--etcd_endpoints=", etcd->endpoint), "--run_id=train",
         absl::StrCat("--worker_id=", w), "--num_workers=2", "--epochs=3",
         "--log_every_steps=100"});
    REQUIRE_OK(p.status());
    workers.push_back(*std::move(p));
  }
  REQUIRE_OK(WaitFor(
      [&] { return absl::StrContains(workers[0]->ReadLog(), "step 200/"); },
      absl::Seconds(90), "worker 0 trained 200 steps"));
  REQUIRE_OK(replicas[0].process->Signal(SIGKILL));
  for (auto& w : workers) {
    absl::StatusOr<int> exit = w->Wait(absl::Seconds(120));
    INFO(w->LogTail());
    REQUIRE_OK(exit.status());
    CHECK(*exit == 0);
  }
  CHECK(absl::StrContains(workers[0]->ReadLog(), "final test accuracy"));
  WaitForRole(replicas[2].address, "primary");
}

TEST_CASE(
    "a spare that cannot store its snapshot is never counted on: pushes do "
    "not wait for it, and it catches up once it can",
    "[replication][disk]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  const std::string run = "capped";
  ServerProcess a = StartReplica(*etcd, run);
  WaitForRole(a.address, "primary");
  CreateTensor(run, a.address);
  {
    TensorSpec big;  // 2 MB more state: a snapshot far beyond the cap below
    big.set_name("big");
    big.add_shape(512 * 1024);
    big.set_init(INIT_CONSTANT);
    big.mutable_optimizer()->set_learning_rate(0.1f);
    REQUIRE_OK(Client(run, a.address, 901)->CreateTensors({big}));
  }
  Push(run, a.address, 1, 40, 1);

  // The spare's files may not grow past 64 KiB (a soft limit, lifted
  // below): its snapshot's write fails midway (EFBIG, as ENOSPC on a full
  // disk). Before, the primary counted a spare once it had sent it the
  // snapshot: this one was marked caught up (it would have been promoted
  // holding nothing), and each time it asked again the pushes waiting for
  // it went on, a few per second.
  const std::string dir = testing::UniqueTmpPath("spare");
  const std::string port_file = dir + ".port";
  std::vector<std::string> args = {
      "-c",
      "trap '' XFSZ; ulimit -S -f 128; exec \"$0\" \"$@\"",
      RunfilePath("server/ps_server"),
      "--port=0",
      absl::StrCat("--port_file=", port_file),
      absl::StrCat("--checkpoint_dir=", dir)};
  const std::vector<std::string> replica = ReplicaArgs(*etcd, run);
  args.insert(args.end(), replica.begin(), replica.end());
  absl::StatusOr<std::unique_ptr<Subprocess>> spare =
      Subprocess::Start("/bin/sh", args, dir + ".log");
  REQUIRE_OK(spare.status());
  INFO("spare's log:\n" << (*spare)->LogTail());
  REQUIRE_OK(WaitFor(
      [&] {
        const std::string log = (*spare)->ReadLog();
        return absl::StrContains(log, "cannot follow primary") &&
               absl::StrContains(log, "shard-0-of-1.ckpt.part: File too large");
      },
      absl::Seconds(30), "the spare fails to store its snapshot"));
  // Pushes go on meanwhile, and the primary never counts the spare.
  bool counted = false;
  std::thread pusher([&] { Push(run, a.address, 2, 40, 1); });
  const absl::Time until = absl::Now() + absl::Seconds(3);
  while (absl::Now() < until) {
    absl::StatusOr<StatusResponse> st = testing::ReplicaStatus(a.address);
    REQUIRE_OK(st.status());
    for (const auto& b : st->replica().backups()) {
      counted = counted || b.counted() || b.caught_up();
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  pusher.join();
  CHECK_FALSE(counted);
  // Nothing of the failed snapshots is left to fill the disk.
  CHECK_FALSE(std::filesystem::exists(dir + "/shard-0-of-1.ckpt.part"));
  CHECK_FALSE(std::filesystem::exists(dir + "/shard-0-of-1.ckpt"));
  // Its retries slow down (each costs the primary a whole snapshot).
  CHECK(absl::StrContains((*spare)->ReadLog(), "(again in 1.6s)"));

  // Room again: the spare stores the snapshot, restores it, catches up.
  REQUIRE(std::system(absl::StrCat("prlimit --pid ", (*spare)->pid(),
                                   " --fsize=unlimited")
                          .c_str()) == 0);
  absl::StatusOr<int> port = testing::WaitForPortFile(
      port_file, spare->get(), absl::Seconds(60), "the spare");
  REQUIRE_OK(port.status());
  const std::string b = absl::StrCat("127.0.0.1:", *port);
  WaitForCounted(a.address, 1);
  Push(run, a.address, 3, 20, 1);
  ExpectSameState(a.address, b);
  ExpectAll(Values(a.address), kInit - 100);
}

TEST_CASE(
    "etcd away for longer than the leases, or back without its data: the "
    "group keeps its state and both replicas, and every acknowledged push is "
    "there once",
    "[replication][etcd]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  const std::string run = "etcdaway";
  ServerProcess a, b;
  StartReplicaPair(*etcd, run, &a, &b);
  CreateTensor(run, a.address);
  // Steps of a client that follows the map: pull, push ones (SGD at rate 1:
  // every acknowledged push takes 1 off every element).
  std::unique_ptr<PsClient> c = testing::MapClient(*etcd, run);
  REQUIRE_OK(c->WaitForTensors({"w"}, absl::Seconds(20)));
  std::atomic<int> acked{0};
  std::atomic<bool> stop{false};
  absl::Status failed;
  std::thread steps([&] {
    std::vector<float> w(kElems);
    const std::vector<float> g(kElems, 1.0f);
    for (int64_t step = 1; !stop.load() && step <= 5000; ++step) {
      auto pull = c->StartPull(step, step, PullSet{{{"w", w.data()}}, {}});
      absl::Status s = pull->Wait();
      if (s.ok()) {
        s = c->StartPush(step, PushSet{{{"w", g.data()}}, {}}, pull->read())
                ->Wait()
                .status();
      }
      if (!s.ok()) {
        failed = s;
        return;
      }
      acked.fetch_add(1);
    }
  });
  REQUIRE_OK(WaitFor([&] { return acked.load() >= 20 || !failed.ok(); },
                     absl::Seconds(30), "steps before etcd goes"));
  // Away for 3 leases. Before, every replica started over when its lease
  // was lost, and the group was claimed anew with nothing in it: the
  // client's next pull failed ("unknown tensor 'w'"). Away for 2: the
  // replicas' reads of the run (waiting for etcd up to 3 s) come back
  // after their leases ran out, and a replica that then found itself
  // fenced started over; both did, with the same result. Back without its
  // data (no map, no member, no lease): both replicas waited for ever for
  // a map that gave them their roles, and the steps for them; now they put
  // back the newest map they saw (server/map_recovery.h). With a third
  // server started as etcd comes back, which writes a new run's first map
  // and claims the shard with nothing in it: the replicas put theirs back
  // over it (they threw their state away and joined it, before the view's
  // older map was checked), and it starts over and stands by: the group
  // has its R replicas.
  struct Away {
    absl::Duration down;
    bool wipe;
    bool newcomer;
  };
  const Away away = GENERATE(Away{absl::Seconds(3), false, false},
                             Away{absl::Seconds(2), false, false},
                             Away{absl::Seconds(1), true, false},
                             Away{absl::Seconds(1), true, true});
  INFO("etcd away for " << absl::FormatDuration(away.down)
                        << (away.wipe ? ", back without its data" : "")
                        << (away.newcomer ? ", a third server started" : ""));
  REQUIRE_OK(
      testing::RestartEtcd(&*etcd, absl::Seconds(30), away.down, away.wipe));
  ServerProcess newcomer;
  if (away.newcomer) newcomer = StartReplica(*etcd, run);
  const int at_restart = acked.load();
  const absl::Status resumed =
      WaitFor([&] { return acked.load() >= at_restart + 50 || !failed.ok(); },
              absl::Seconds(60), "steps after etcd is back");
  stop = true;
  steps.join();
  INFO("replica a's log:\n"
       << a.process->ReadLog() << "\nreplica b's log:\n"
       << b.process->ReadLog());
  REQUIRE_OK(failed);
  REQUIRE_OK(resumed);
  INFO(acked.load() << " pushes acknowledged, " << at_restart
                    << " when etcd came back");
  if (away.wipe) {
    CHECK(absl::StrContains(a.process->ReadLog() + b.process->ReadLog(),
                            "put the run's shard map back"));
  }
  if (away.newcomer) {
    // Left out of the map put back, it served no longer as the primary it
    // had claimed (it serves on a port of its own as a spare now). Its
    // role thread finds that out when the steps may already have resumed,
    // and the restart's line follows its shutdown.
    const absl::Status restarted = WaitFor(
        [&] {
          return absl::StrContains(newcomer.process->ReadLog(),
                                   "starting over as a spare");
        },
        absl::Seconds(20), "the third server to start over");
    const std::string log = newcomer.process->ReadLog();
    INFO("the third server's log:\n" << log);
    CHECK(newcomer.process->Running());
    CHECK(absl::StrContains(log, "claimed shard 0 as its primary"));
    CHECK(restarted.ok());
  }
  // Both replicas still serve the group, at the same state; every push
  // acknowledged is applied once. With the third server: the group stays
  // at R, the one left out (the newcomer, or the replica dropped while its
  // key was not back) stands by.
  REQUIRE(a.process->Running());
  REQUIRE(b.process->Running());
  std::string primary;
  REQUIRE_OK(WaitFor(
      [&] {
        for (const ServerProcess* p : {&a, &b}) {
          absl::StatusOr<StatusResponse> st =
              testing::ReplicaStatus(p->address);
          if (st.ok() && st->replica().role() == "primary") {
            primary = p->address;
          }
        }
        return !primary.empty();
      },
      absl::Seconds(20), "a primary among the two replicas"));
  std::string backup;
  REQUIRE_OK(WaitFor(
      [&] {
        absl::StatusOr<StatusResponse> st = testing::ReplicaStatus(primary);
        if (!st.ok() || st->replica().backups_size() != 1) return false;
        const auto& only = st->replica().backups(0);
        backup = only.address();
        return only.counted() && only.caught_up();
      },
      absl::Seconds(30), "one backup counted"));
  if (away.newcomer) {
    for (const ServerProcess* p : {&a, &b, &newcomer}) {
      if (p->address == primary || p->address == backup) continue;
      INFO("the one left out: " << p->address);
      CHECK(p->process->Running());
      const absl::Status stood_by = WaitFor(
          [&] {
            return absl::StrContains(p->process->ReadLog(),
                                     "stands by and joins it when one leaves");
          },
          absl::Seconds(20), "the one left out to stand by");
      CHECK(stood_by.ok());
    }
  } else {
    CHECK(backup == (primary == a.address ? b.address : a.address));
  }
  ExpectSameState(primary, backup);
  ExpectAll(Values(primary), kInit - acked.load());
}

TEST_CASE(
    "replicas and etcd over TLS, a cluster token: the backup follows over "
    "TLS and takes over with every acknowledged push",
    "[replication][tls]") {
  if (testing::SkipWithoutEtcd()) return;
  const testing::Pki& pki = testing::TestPki();
  absl::StatusOr<testing::EtcdProcess> etcd =
      testing::StartEtcd(absl::Seconds(30), {},
                         {pki.server_cert, pki.server_key, pki.ca,
                          pki.client_cert, pki.client_key});
  REQUIRE_OK(etcd.status());
  {
    // Without etcd's TLS flags a server cannot join, and says what to give.
    std::vector<std::string> plain = {
        "--host=127.0.0.1", "--run_id=tls", "--replicas=2",
        absl::StrCat("--etcd_endpoints=", etcd->endpoint), "--lease_ms=1000"};
    auto [exit, log] = RunServer(plain);
    CHECK(exit == 2);
    CHECK(absl::StrContains(log, "cannot reach etcd"));
    CHECK(absl::StrContains(log, "--etcd_ca, --etcd_cert"));
    plain.push_back("--etcd_cert=" + pki.client_cert);
    std::tie(exit, log) = RunServer(plain);
    CHECK(exit == 2);
    CHECK(absl::StrContains(log, "--etcd_cert needs --etcd_key"));
  }
  // A replica's --tls_ca is for its own connections to the other.
  const std::vector<std::string> tls = {
      "--tls_cert=" + pki.server_cert, "--tls_key=" + pki.server_key,
      "--tls_ca=" + pki.ca, "--cluster_token_file=" + pki.token_file};
  SecurityOptions client;
  client.tls_ca = pki.ca;
  client.cluster_token = testing::kClusterToken;
  ServerProcess a = StartReplica(*etcd, "tls", tls);
  WaitForRole(a.address, "primary", absl::Seconds(20), client);
  ServerProcess b = StartReplica(*etcd, "tls", tls);
  WaitForRole(b.address, "backup", absl::Seconds(20), client);
  WaitForCounted(a.address, 1, client);
  // Neither answers in plain TCP.
  CHECK_FALSE(testing::ReplicaStatus(a.address).ok());
  CHECK_FALSE(testing::ReplicaStatus(b.address).ok());

  std::unique_ptr<PsClient> worker =
      testing::MapClient(*etcd, "tls", /*reader=*/false, client);
  REQUIRE_OK(worker->CreateTensors({WSpec()}));
  const std::vector<float> grad(kElems, 1.0f);
  for (int i = 0; i < 20; ++i) {
    REQUIRE_OK(worker->Push(i, {{"w", grad.data()}}).status());
  }
  testing::ExpectSameState(a.address, b.address, client);
  {
    // psctl finds the group through etcd over TLS too.
    auto [exit, out] =
        Psctl(*etcd, "tls",
              {"--tls_ca=" + pki.ca,
               std::string("--cluster_token_file=") + pki.token_file});
    INFO(out);
    CHECK(exit == 0);
    CHECK(absl::StrContains(out, "primary"));
  }

  REQUIRE(a.process->Signal(SIGKILL).ok());
  (void)a.process->Wait(absl::Seconds(10));
  WaitForRole(b.address, "primary", absl::Seconds(20), client);
  std::unique_ptr<PsClient> reader =
      testing::MapClient(*etcd, "tls", /*reader=*/true, client);
  REQUIRE_OK(reader->WaitForTensors({"w"}, absl::Seconds(20)));
  std::vector<float> values(kElems, -1e9f);
  REQUIRE_OK(reader->Pull(0, {{"w", values.data()}}));
  ExpectAll(values, kInit - 20);
}

TEST_CASE(
    "payloads of 16 KiB and more reach the backup from the pushes' own "
    "buffers, bit for bit, and outlive the primary",
    "[replication]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  ServerProcess a, b;
  StartReplicaPair(*etcd, "big", &a, &b);
  // Three slices of 8192 floats (32 KiB payloads: the entries share the
  // primary's receive buffers) and a tail of 100 (copied).
  constexpr int kBig = 3 * 8192 + 100;
  std::unique_ptr<PsClient> worker = testing::MapClient(*etcd, "big");
  REQUIRE_OK(worker->CreateTensors({WSpecOf("big", kBig, 8192)}));
  std::vector<float> expected(kBig, kInit), grad(kBig);
  for (int step = 0; step < 20; ++step) {
    // Integers that differ per element and per push: exact sums.
    for (int i = 0; i < kBig; ++i) grad[i] = (i * 7 + step) % 13;
    REQUIRE_OK(worker->Push(step, {{"big", grad.data()}}).status());
    for (int i = 0; i < kBig; ++i) expected[i] -= grad[i];
  }
  testing::ExpectSameState(a.address, b.address);

  REQUIRE(a.process->Signal(SIGKILL).ok());
  (void)a.process->Wait(absl::Seconds(10));
  WaitForRole(b.address, "primary", absl::Seconds(20));
  std::unique_ptr<PsClient> reader =
      testing::MapClient(*etcd, "big", /*reader=*/true);
  REQUIRE_OK(reader->WaitForTensors({"big"}, absl::Seconds(20)));
  std::vector<float> values(kBig, -1e9f);
  REQUIRE_OK(reader->Pull(0, {{"big", values.data()}}));
  int wrong = 0;
  for (int i = 0; i < kBig; ++i) wrong += values[i] != expected[i];
  CHECK(wrong == 0);
}

TEST_CASE(
    "a replica's log keeps at most --replication_log_mib of entries, and a "
    "spare it no longer covers starts from a snapshot",
    "[replication]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  const std::vector<std::string> small_log = {"--replication_log_mib=1"};
  ServerProcess a, b;
  StartReplicaPair(*etcd, "logcap", &a, &b, small_log);
  // 256 KiB per push: 12 pushes are 3 MiB of entries.
  constexpr int kWide = 65536;
  std::unique_ptr<PsClient> worker = testing::MapClient(*etcd, "logcap");
  REQUIRE_OK(worker->CreateTensors({WSpecOf("wide", kWide, 16384)}));
  const std::vector<float> grad(kWide, 1.0f);
  int pushed = 0;
  const auto push = [&](int n) {
    for (int i = 0; i < n; ++i, ++pushed) {
      REQUIRE_OK(worker->Push(pushed, {{"wide", grad.data()}}).status());
    }
  };
  push(12);
  testing::ExpectSameState(a.address, b.address);
  for (const ServerProcess* p : {&a, &b}) {
    absl::StatusOr<StatusResponse> st = testing::ReplicaStatus(p->address);
    REQUIRE_OK(st.status());
    const ReplicaStatus& r = st->replica();
    INFO(r.role() << ": " << r.log_kept_entries() << " entries, "
                  << r.log_kept_bytes() << " bytes kept of " << r.log_index());
    CHECK(r.log_index() >= 13);
    CHECK(r.log_kept_bytes() <= (uint64_t{1} << 20));
    CHECK(r.log_kept_bytes() >= 3 * (uint64_t{256} << 10));
    CHECK(r.log_kept_entries() >= 3);
    CHECK(r.log_kept_entries() <= 4);
  }
  {
    // psctl status shows what the primary's log keeps.
    auto [exit, out] = Psctl(*etcd, "logcap");
    INFO(out);
    CHECK(exit == 0);
    CHECK(absl::StrContains(out, "LOG KEPT"));
    CHECK(std::regex_search(out, std::regex(" KiB \\([34]\\)")));
  }
  // The backup dies; a new process joins as a spare. The entries it would
  // need are gone from the primary's log: it is sent a snapshot.
  REQUIRE(b.process->Signal(SIGKILL).ok());
  (void)b.process->Wait(absl::Seconds(10));
  ServerProcess c = StartReplica(*etcd, "logcap", small_log);
  WaitForRole(c.address, "backup");
  WaitForCounted(a.address, 1);
  push(2);
  testing::ExpectSameState(a.address, c.address);
  absl::StatusOr<StatusResponse> st = testing::ReplicaStatus(a.address);
  REQUIRE_OK(st.status());
  CHECK(st->replica().snapshots_sent() >= 1);
  std::vector<float> values(kWide, -1e9f);
  REQUIRE_OK(worker->Pull(pushed, {{"wide", values.data()}}));
  ExpectAll(values, kInit - pushed);
}

TEST_CASE("bad replication settings exit 2 saying what to fix",
          "[replication]") {
  {
    auto [exit, log] = RunServer({"--replicas=2", "--run_id=x"});
    CHECK(exit == 2);
    CHECK(absl::StrContains(log, "needs --etcd_endpoints"));
  }
  for (const char* bad : {"--replication_log_mib=0", "--replication_log_mib=-4",
                          "--replication_log_mib=1048577"}) {
    auto [exit, log] = RunServer({bad});
    INFO(bad);
    CHECK(exit == 2);
    CHECK(absl::StrContains(log, "--replication_log_mib must be in"));
  }
  {
    auto [exit, log] = RunServer({"--etcd_endpoints=127.0.0.1:1"});
    CHECK(exit == 2);
    CHECK(absl::StrContains(log, "needs --run_id"));
  }
  // Names that would go into the map as they are: refused before etcd.
  for (const char* bad :
       {"--host_label=a b", "--host_label=node\x01", "--advertise_address=:::",
        "--advertise_address=h\tx:7000", "--advertise_address=h:70000"}) {
    auto [exit, log] = RunServer({bad, "--etcd_endpoints=127.0.0.1:1"});
    INFO(bad << ": " << log);
    CHECK(exit == 2);
    CHECK((absl::StrContains(log, "--host_label must be a host or node name") ||
           absl::StrContains(log, "is not host:port with port 1..65535")));
  }
  {
    absl::StatusOr<std::string> unused = testing::UnusedLoopbackAddress();
    REQUIRE_OK(unused.status());
    auto [exit, log] = RunServer({"--host=127.0.0.1", "--run_id=x",
                                  absl::StrCat("--etcd_endpoints=", *unused)});
    CHECK(exit == 2);
    CHECK(absl::StrContains(log, "cannot reach etcd"));
  }
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  ServerProcess a = StartReplica(*etcd, "shape");
  WaitForRole(a.address, "primary");
  // The Follow stream serves only replicas the map lists, and only after a
  // well-formed first message.
  auto stub = Replication::NewStub(MakeChannel(a.address));
  auto follow = [&](const FollowUp& first) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    auto stream = stub->Follow(&ctx);
    stream->Write(first);
    stream->WritesDone();
    FollowFeed feed;
    CHECK_FALSE(stream->Read(&feed));  // no snapshot, no entry
    return stream->Finish();
  };
  FollowUp stray;
  stray.mutable_follow()->set_run_id("shape");
  stray.mutable_follow()->set_num_shards(1);
  stray.mutable_follow()->set_address("127.0.0.1:1");
  stray.mutable_follow()->set_incarnation(5);
  CHECK(follow(stray).error_code() == grpc::StatusCode::PERMISSION_DENIED);
  FollowUp ack_first;
  ack_first.set_applied(3);
  CHECK(follow(ack_first).error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  // The same run with another shape: one prefix per run.
  std::vector<std::string> args = ReplicaArgs(*etcd, "shape");
  args.push_back("--num_shards=2");
  auto [exit, log] = RunServer(args);
  CHECK(exit == 2);
  CHECK(absl::StrContains(log, "one prefix per run"));
}

}  // namespace
}  // namespace asyncps
