// replication_bench: what replicating a shard costs and how fast a
// replica catches up, against ps_server processes on loopback and a real
// etcd (Debian's etcd-server).
//
// 1. Cost: one shard unreplicated (R = 1) and one of two replicas (R = 2),
//    the same worker loop (pull then push of --push_kib) alternating
//    between them in every repetition; push and pull latency p50/p99 and
//    steps/s, and the ratio R2 / R1.
// 2. Catch-up: a primary holding --catchup_mib MiB while a worker pushes;
//    a spare starts and is timed until the map calls it caught up (MB/s),
//    with the worker's steps/s before and during.
// 3. Failover: --failovers times, the primary is killed (SIGKILL) and timed
//    until a new client's push is acknowledged by the backup that took
//    over (the killed process is then started again as a spare).
//
// Output: one "key=value ..." line per measurement.

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/ps_client.h"
#include "common/net.h"
#include "proto/asyncps.grpc.pb.h"
#include "tests/bench/bench_util.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/subprocess.h"

ABSL_FLAG(int, push_kib, 64, "KiB per push (and pull) in the cost part");
ABSL_FLAG(int, steps, 300, "steps per setup per repetition");
ABSL_FLAG(int, reps, 5, "repetitions (setups alternate in each)");
ABSL_FLAG(int, catchup_mib, 256, "MiB the primary holds in the catch-up part");
ABSL_FLAG(int, failovers, 5, "primaries killed in the failover part");
ABSL_FLAG(std::string, parts, "cost,catchup,failover", "parts to run");
ABSL_FLAG(std::string, server_log_level, "warn", "ps_server --log_level");

namespace asyncps {
namespace {

using SteadyClock = std::chrono::steady_clock;
using testing::ServerProcess;

void Die(const absl::Status& s) {
  std::fprintf(stderr, "replication_bench: %s\n", s.ToString().c_str());
  std::exit(1);
}

template <typename T>
T Check(absl::StatusOr<T> v) {
  if (!v.ok()) Die(v.status());
  return *std::move(v);
}

ServerProcess Replica(const testing::EtcdProcess& etcd, const std::string& run,
                      int replicas = 2) {
  return Check(testing::StartPsServer(
      0, 1,
      {"--host=127.0.0.1", absl::StrCat("--run_id=", run),
       absl::StrCat("--replicas=", replicas),
       absl::StrCat("--etcd_endpoints=", etcd.endpoint),
       absl::StrCat("--log_level=", absl::GetFlag(FLAGS_server_log_level))}));
}

StatusResponse Status(const std::string& address) {
  auto stub = ParameterServer::NewStub(MakeChannel(address));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  StatusResponse r;
  stub->Status(&ctx, StatusRequest(), &r);
  return r;
}

// Waits until the primary counts `n` backups the map calls caught up.
void WaitCaughtUp(const std::string& primary, int n) {
  for (;;) {
    int k = 0;
    const StatusResponse status = Status(primary);
    for (const auto& b : status.replica().backups()) {
      k += b.counted() && b.caught_up();
    }
    if (k == n) return;
    absl::SleepFor(absl::Milliseconds(5));
  }
}

void WaitPrimary(const std::string& address) {
  while (Status(address).replica().role() != "primary") {
    absl::SleepFor(absl::Milliseconds(5));
  }
}

std::unique_ptr<PsClient> Client(const std::string& address,
                                 const std::string& run, int worker) {
  PsClientOptions o;
  o.servers = {address};
  o.run_id = run;
  o.worker_id = worker;
  auto c = Check(PsClient::Connect(o));
  if (absl::Status s = c->WaitForShards(absl::Seconds(30)); !s.ok()) Die(s);
  return c;
}

TensorSpec Tensor(const std::string& name, int64_t floats) {
  TensorSpec t;
  t.set_name(name);
  t.add_shape(floats);
  t.set_init(INIT_CONSTANT);
  t.set_init_value(1.0f);
  t.mutable_optimizer()->set_learning_rate(0.001f);
  return t;
}

// A worker of one tensor: pull, push, `steps` times; latencies in us.
struct Loop {
  std::unique_ptr<PsClient> client;
  std::string tensor;
  std::vector<float> params, grads;
  int64_t clock = 0;

  void Step(std::vector<double>* pull_us, std::vector<double>* push_us) {
    const auto t0 = SteadyClock::now();
    if (absl::Status s = client->Pull(clock, {{tensor, params.data()}});
        !s.ok()) {
      Die(s);
    }
    const auto t1 = SteadyClock::now();
    if (absl::Status s = client->Push(clock, {{tensor, grads.data()}}).status();
        !s.ok()) {
      Die(s);
    }
    const auto t2 = SteadyClock::now();
    ++clock;
    if (pull_us != nullptr) pull_us->push_back(Seconds(t0, t1) * 1e6);
    if (push_us != nullptr) push_us->push_back(Seconds(t1, t2) * 1e6);
  }
};

Loop MakeLoop(const std::string& address, const std::string& run,
              const std::string& tensor, int64_t floats, bool create) {
  Loop l;
  l.client = Client(address, run, 1);
  l.tensor = tensor;
  if (create) {
    if (absl::Status s = l.client->CreateTensors({Tensor(tensor, floats)});
        !s.ok()) {
      Die(s);
    }
  }
  if (absl::Status s = l.client->WaitForTensors({tensor}, absl::Seconds(30));
      !s.ok()) {
    Die(s);
  }
  if (absl::Status s = l.client->Register().status(); !s.ok()) Die(s);
  l.params.assign(floats, 0.0f);
  l.grads.assign(floats, 0.001f);
  return l;
}

void Cost(const testing::EtcdProcess& etcd) {
  const int64_t floats = int64_t{absl::GetFlag(FLAGS_push_kib)} * 256;
  ServerProcess one = Check(testing::StartPsServer(
      0, 1, {"--host=127.0.0.1", "--run_id=cost1", "--log_level=warn"}));
  ServerProcess p = Replica(etcd, "cost2");
  WaitPrimary(p.address);
  ServerProcess b = Replica(etcd, "cost2");
  WaitCaughtUp(p.address, 1);
  Loop loops[2] = {MakeLoop(one.address, "cost1", "w", floats, true),
                   MakeLoop(p.address, "cost2", "w", floats, true)};
  std::vector<double> pull[2], push[2], rate[2];
  // CPU per step of the serving processes: R = 1's shard; R = 2's primary
  // and backup.
  const pid_t pids[2][2] = {{one.process->pid(), 0},
                            {p.process->pid(), b.process->pid()}};
  std::vector<double> cpu[2][2];
  const auto cpu_of = [](pid_t pid) {
    absl::StatusOr<testing::ProcessResources> r =
        testing::ReadProcessResources(pid);
    return pid != 0 && r.ok() ? r->cpu_seconds : 0.0;
  };
  const int steps = absl::GetFlag(FLAGS_steps);
  for (int rep = 0; rep < absl::GetFlag(FLAGS_reps); ++rep) {
    for (int r = 0; r < 2; ++r) {
      const double cpu0[2] = {cpu_of(pids[r][0]), cpu_of(pids[r][1])};
      const auto t0 = SteadyClock::now();
      for (int i = 0; i < steps; ++i) loops[r].Step(&pull[r], &push[r]);
      rate[r].push_back(steps / Seconds(t0, SteadyClock::now()));
      for (int k = 0; k < 2; ++k) {
        cpu[r][k].push_back((cpu_of(pids[r][k]) - cpu0[k]) * 1e6 / steps);
      }
    }
  }
  for (int r = 0; r < 2; ++r) {
    std::printf(
        "part=cost replicas=%d push_kib=%d push_p50_us=%.0f push_p99_us=%.0f "
        "pull_p50_us=%.0f pull_p99_us=%.0f steps_per_s=%.0f "
        "%s_cpu_us_per_step=%.0f",
        r + 1, absl::GetFlag(FLAGS_push_kib), Percentile(push[r], 0.5),
        Percentile(push[r], 0.99), Percentile(pull[r], 0.5),
        Percentile(pull[r], 0.99), Percentile(rate[r], 0.5),
        r == 0 ? "shard" : "primary", Percentile(cpu[r][0], 0.5));
    if (r == 1) {
      std::printf(" backup_cpu_us_per_step=%.0f", Percentile(cpu[r][1], 0.5));
    }
    std::printf("\n");
  }
  std::printf("part=cost r2_over_r1_steps_per_s=%.3f\n",
              Percentile(rate[1], 0.5) / Percentile(rate[0], 0.5));
}

void CatchUp(const testing::EtcdProcess& etcd) {
  const int64_t floats = int64_t{absl::GetFlag(FLAGS_catchup_mib)} << 18;
  ServerProcess p = Replica(etcd, "catchup");
  WaitPrimary(p.address);
  {
    auto admin = Client(p.address, "catchup", 9);
    if (absl::Status s = admin->CreateTensors({Tensor("big", floats)});
        !s.ok()) {
      Die(s);
    }
  }
  Loop loop = MakeLoop(p.address, "catchup", "w", 16 << 10, true);
  std::atomic<bool> stop{false};
  std::atomic<int64_t> steps{0};
  std::thread worker([&] {
    while (!stop) {
      loop.Step(nullptr, nullptr);
      steps.fetch_add(1);
    }
  });
  auto rate = [&](absl::Duration d) {
    const int64_t s0 = steps.load();
    const auto t0 = SteadyClock::now();
    absl::SleepFor(d);
    return (steps.load() - s0) / Seconds(t0, SteadyClock::now());
  };
  const double before = rate(absl::Seconds(3));
  const auto t0 = SteadyClock::now();
  const int64_t s0 = steps.load();
  ServerProcess spare = Replica(etcd, "catchup");
  WaitCaughtUp(p.address, 1);
  const double took = Seconds(t0, SteadyClock::now());
  const double during = (steps.load() - s0) / took;
  stop = true;
  worker.join();
  const double mb = floats * 4 / 1e6;
  std::printf(
      "part=catchup state_mb=%.0f caught_up_s=%.2f mb_per_s=%.0f "
      "steps_per_s_before=%.0f steps_per_s_during=%.0f "
      "during_over_before=%.2f\n",
      mb, took, mb / took, before, during, during / before);
}

void Failover(const testing::EtcdProcess& etcd) {
  ServerProcess a = Replica(etcd, "failover");
  WaitPrimary(a.address);
  ServerProcess b = Replica(etcd, "failover");
  WaitCaughtUp(a.address, 1);
  {
    auto admin = Client(a.address, "failover", 9);
    if (absl::Status s = admin->CreateTensors({Tensor("w", 1024)}); !s.ok()) {
      Die(s);
    }
  }
  std::vector<double> times;
  for (int i = 0; i < absl::GetFlag(FLAGS_failovers); ++i) {
    const auto t0 = SteadyClock::now();
    if (absl::Status s = a.process->Signal(SIGKILL); !s.ok()) Die(s);
    (void)a.process->Wait(absl::Seconds(10));
    WaitPrimary(b.address);
    Loop l = MakeLoop(b.address, "failover", "w", 1024, false);
    l.Step(nullptr, nullptr);
    times.push_back(Seconds(t0, SteadyClock::now()));
    std::printf("part=failover round=%d kill_to_first_ack_s=%.2f\n", i,
                times.back());
    std::fflush(stdout);
    a = Replica(etcd, "failover");
    WaitCaughtUp(b.address, 1);
    std::swap(a, b);
  }
  std::printf("part=failover rounds=%zu p50_s=%.2f max_s=%.2f\n", times.size(),
              Percentile(times, 0.5), Percentile(times, 1.0));
}

}  // namespace
}  // namespace asyncps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::StatusOr<asyncps::testing::EtcdProcess> etcd =
      asyncps::testing::StartEtcd();
  if (!etcd.ok()) asyncps::Die(etcd.status());
  const std::string parts = absl::GetFlag(FLAGS_parts);
  if (absl::StrContains(parts, "cost")) asyncps::Cost(*etcd);
  if (absl::StrContains(parts, "catchup")) asyncps::CatchUp(*etcd);
  if (absl::StrContains(parts, "failover")) asyncps::Failover(*etcd);
  return 0;
}
