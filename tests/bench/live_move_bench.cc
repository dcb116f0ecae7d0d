// live_move_bench: what a live slot move costs a training run, on two
// ps_server processes of a slotted run on loopback.
//
// A worker trains (pulls a small tensor and one of --tensors big ones,
// pushes both back: the big ones change while they move) and its steps are
// timed for --window_s before a move, during it, and after. The move takes
// half of shard 0's slots to shard 1 (SlotMoves/MoveSlots, as psctl move
// does). Printed: the state moved and its rate (MB/s, against memcpy's rate
// measured in the same run), copy and fence times, and the worker's steps/s
// and step p50/p99/max before, during and after, as ratios to before, and
// the CPU each shard used during the move, also per GB of records moved
// (with --train=false: what the copy alone costs each side), the
// destination's CPU in the kernel, how much its resident memory grew
// (against the state it took) and the page faults that took.
//
// Output: one "key=value ..." line per measurement.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/ps_client.h"
#include "common/map_change.h"
#include "common/net.h"
#include "common/shard_map_proto.h"
#include "proto/slot_moves.grpc.pb.h"
#include "tests/bench/bench_util.h"
#include "tests/testing/subprocess.h"

ABSL_FLAG(int, state_mib, 512, "MiB of parameters in the run (both shards)");
ABSL_FLAG(int, tensors, 64, "big tensors the state is cut into");
ABSL_FLAG(int, slots, 256, "slots of the run");
ABSL_FLAG(double, window_s, 3, "seconds timed before and after the move");
ABSL_FLAG(std::string, optimizer, "adam", "sgd or adam (3x the state)");
ABSL_FLAG(std::string, server_flags, "",
          "more ps_server flags, space-separated (e.g. --move_copy_nice=0)");
ABSL_FLAG(bool, train, true,
          "train during the move (false: the copy alone, the machine idle)");

namespace asyncps {
namespace {

using SteadyClock = std::chrono::steady_clock;
using testing::ServerProcess;

void Die(const absl::Status& s) {
  std::fprintf(stderr, "live_move_bench: %s\n", s.ToString().c_str());
  std::exit(1);
}

// memcpy of 256 MiB, best of 3: the machine's copy rate in MB/s.
double MemcpyMBps() {
  const size_t n = size_t{256} << 20;
  std::vector<char> a(n, 1), b(n, 2);
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = SteadyClock::now();
    std::memcpy(b.data(), a.data(), n);
    best = std::max(best, n / 1e6 / Seconds(t0, SteadyClock::now()));
  }
  return best + b[n / 2] * 0;
}

// What the shard's process has used so far (zeros once it is gone).
testing::ProcessResources Resources(const ServerProcess& shard) {
  absl::StatusOr<testing::ProcessResources> r =
      testing::ReadProcessResources(shard.process->pid());
  return r.ok() ? *r : testing::ProcessResources{};
}

TensorSpec Tensor(const std::string& name, int64_t floats) {
  TensorSpec t;
  t.set_name(name);
  t.add_shape(floats);
  t.set_init(INIT_CONSTANT);
  t.set_init_value(0.5f);
  if (absl::GetFlag(FLAGS_optimizer) == "adam") {
    t.mutable_optimizer()->set_type(OPT_ADAM);
    t.mutable_optimizer()->set_beta1(0.9f);
    t.mutable_optimizer()->set_beta2(0.999f);
    t.mutable_optimizer()->set_epsilon(1e-8f);
  }
  t.mutable_optimizer()->set_learning_rate(0.001f);
  return t;
}

// The worker: step latencies by phase (0 before, 1 during, 2 after).
struct Worker {
  std::unique_ptr<PsClient> client;
  int tensors = 0;
  int64_t big_floats = 0;
  std::atomic<int> phase{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<double> ms[3];
  double seconds[3] = {0, 0, 0};

  void Run() {
    std::vector<float> small(16384), big(big_floats);
    const std::vector<float> gsmall(small.size(), 0.01f),
        gbig(big.size(), 0.01f);
    auto phase_start = SteadyClock::now();
    int current = 0;
    const bool train = absl::GetFlag(FLAGS_train);
    for (int64_t step = 1; !stop.load(); ++step) {
      if (!train) {
        absl::SleepFor(absl::Milliseconds(10));
        continue;
      }
      const std::string name = absl::StrCat("big", step % tensors);
      const auto t0 = SteadyClock::now();
      auto pull = client->StartPull(
          step, step, PullSet{{{"small", small.data()}, {name, big.data()}}});
      if (absl::Status s = pull->Wait(); !s.ok()) Die(s);
      auto push = client->StartPush(
          step, PushSet{{{"small", gsmall.data()}, {name, gbig.data()}}},
          pull->read());
      if (absl::Status s = push->Wait().status(); !s.ok()) Die(s);
      const auto t1 = SteadyClock::now();
      const int p = phase.load();
      std::lock_guard<std::mutex> l(mu);
      if (p != current) {
        seconds[current] = Seconds(phase_start, t0);
        phase_start = t0;
        current = p;
      }
      ms[p].push_back(Seconds(t0, t1) * 1e3);
    }
    std::lock_guard<std::mutex> l(mu);
    seconds[current] = Seconds(phase_start, SteadyClock::now());
  }
};

void Main() {
  const int slots = absl::GetFlag(FLAGS_slots);
  const int tensors = absl::GetFlag(FLAGS_tensors);
  const int64_t big_floats =
      int64_t{absl::GetFlag(FLAGS_state_mib)} * 262144 / tensors;
  std::vector<ServerProcess> shards;
  for (int i = 0; i < 2; ++i) {
    std::vector<std::string> flags = {absl::StrCat("--num_slots=", slots),
                                      "--log_level=warn"};
    for (absl::string_view f : absl::StrSplit(absl::GetFlag(FLAGS_server_flags),
                                              ' ', absl::SkipEmpty())) {
      flags.emplace_back(f);
    }
    absl::StatusOr<ServerProcess> s = testing::StartPsServer(i, 2, flags);
    if (!s.ok()) Die(s.status());
    shards.push_back(*std::move(s));
  }
  PsClientOptions o;
  for (const ServerProcess& s : shards) o.servers.push_back(s.address);
  o.retry.call_deadline = absl::Seconds(60);
  Worker w;
  w.client = *PsClient::Connect(o);
  w.tensors = tensors;
  w.big_floats = big_floats;
  if (absl::Status s = w.client->WaitForShards(absl::Seconds(30)); !s.ok()) {
    Die(s);
  }
  std::vector<TensorSpec> specs = {Tensor("small", 16384)};
  for (int i = 0; i < tensors; ++i) {
    specs.push_back(Tensor(absl::StrCat("big", i), big_floats));
  }
  if (absl::Status s = w.client->CreateTensors(specs); !s.ok()) Die(s);
  if (absl::Status s = w.client->Register().status(); !s.ok()) Die(s);

  const double memcpy_mbps = MemcpyMBps();
  std::thread training([&w] { w.Run(); });
  absl::SleepFor(absl::Seconds(absl::GetFlag(FLAGS_window_s)));

  // Half of shard 0's slots to shard 1.
  const ShardMap map = w.client->map();
  std::vector<uint32_t> moving;
  bool take = false;
  for (int s = 0; s < slots; ++s) {
    if (map.owners()[s] == 0 && (take = !take)) moving.push_back(s);
  }
  absl::StatusOr<ShardMap> next = WithSlotsMoved(map, moving, 1);
  if (!next.ok()) Die(next.status());
  MoveSlotsRequest request;
  request.set_source(shards[0].address);
  request.set_source_index(0);
  request.set_destination(shards[1].address);
  ShardMapToProto(*next, request.mutable_next_map());
  auto stub = SlotMoves::NewStub(MakeChannel(shards[1].address));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(10)));
  MoveSlotsResponse r;
  w.phase = 1;
  const testing::ProcessResources source0 = Resources(shards[0]);
  const testing::ProcessResources destination0 = Resources(shards[1]);
  const auto t0 = SteadyClock::now();
  const grpc::Status st = stub->MoveSlots(&ctx, request, &r);
  const double move_s = Seconds(t0, SteadyClock::now());
  const testing::ProcessResources source1 = Resources(shards[0]);
  const testing::ProcessResources destination1 = Resources(shards[1]);
  const double source_cpu = source1.cpu_seconds - source0.cpu_seconds;
  const double destination_cpu =
      destination1.cpu_seconds - destination0.cpu_seconds;
  w.phase = 2;
  if (!st.ok()) Die(absl::UnknownError(st.error_message()));
  absl::SleepFor(absl::Seconds(absl::GetFlag(FLAGS_window_s)));
  w.stop = true;
  training.join();

  // The state's rate: the first round copies all of it.
  const double mbps = r.state_bytes() / 1e3 / r.first_round_ms();
  std::printf(
      "move slots=%u slices=%llu state_bytes=%llu first_round_ms=%.1f "
      "state_MBps=%.0f memcpy_MBps=%.0f ratio_to_memcpy=%.3f rounds=%u "
      "record_bytes=%llu seconds=%.3f copy_ms=%.1f fence_ms=%.1f "
      "source_cpu_s=%.2f destination_cpu_s=%.2f source_cpu_s_per_gb=%.2f "
      "destination_cpu_s_per_gb=%.2f destination_system_cpu_s=%.2f "
      "destination_rss_growth_mb=%.0f destination_page_faults=%lld\n",
      r.slots(), static_cast<unsigned long long>(r.slices()),
      static_cast<unsigned long long>(r.state_bytes()), r.first_round_ms(),
      mbps, memcpy_mbps, mbps / memcpy_mbps, r.rounds(),
      static_cast<unsigned long long>(r.bytes()), move_s, r.copy_ms(),
      r.fence_ms(), source_cpu, destination_cpu,
      source_cpu / std::max(r.bytes() / 1e9, 1e-9),
      destination_cpu / std::max(r.bytes() / 1e9, 1e-9),
      destination1.system_seconds - destination0.system_seconds,
      (destination1.rss_bytes - destination0.rss_bytes) / 1e6,
      static_cast<long long>(destination1.minor_faults -
                             destination0.minor_faults));
  const char* names[3] = {"before", "during", "after"};
  const double base_rate = w.ms[0].size() / std::max(w.seconds[0], 1e-9);
  for (int p = 0; p < 3; ++p) {
    const double rate = w.ms[p].size() / std::max(w.seconds[p], 1e-9);
    std::printf(
        "steps phase=%s n=%zu steps_per_s=%.1f ratio_to_before=%.3f "
        "p50_ms=%.1f p99_ms=%.1f max_ms=%.1f\n",
        names[p], w.ms[p].size(), rate, rate / base_rate,
        Percentile(w.ms[p], 0.5), Percentile(w.ms[p], 0.99),
        Percentile(w.ms[p], 1.0));
  }
}

}  // namespace
}  // namespace asyncps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  asyncps::Main();
  return 0;
}
