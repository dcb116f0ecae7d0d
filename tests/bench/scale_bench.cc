// scale_bench: how the shards' costs grow with the number of workers.
//
// For each consistency policy (--policies: asp, ssp with --ssp_slack) and
// each worker count W (--workers), the bench starts --shards ps_server
// processes on loopback and W simulated workers in this process. Each
// simulated worker is a real PsClient with its own identity (worker id,
// incarnation) and its own connection to every shard
// (connections_per_shard = 1), and runs the training loop of a real worker
// with the compute replaced by a sleep: pull the tensor for its clock,
// "compute", push the gradient, next clock. The aggregate load is the same
// for every W (--steps_per_s steps per second over all workers): each
// worker starts a step every P seconds, P drawn per step with mean
// W / steps_per_s, uniformly spread by +-(--jitter) so that workers drift
// apart as real ones do: pull, compute (a sleep) until P/2 into the step,
// push, then idle until the step's P is over (a pull or push slower than
// that stretches the step). The workers start at random points of their
// first step (steady state, not a burst of W simultaneous first steps).
//
// Measured per run (after --warmup_s, for --seconds):
//   steps_per_s, mb_per_s    achieved aggregate steps and payload (pull +
//                            push) per second;
//   pull/push p50, p99       client-side latency of one pull / one push
//                            (all shards answered), in ms; under SSP a
//                            pull's latency includes its wait for slower
//                            workers;
//   ssp_wait_share           of the shards' pulls, the share that had to
//                            wait for slower workers (Status counters);
//   shard_cpu_us_per_step    CPU time of all shards (user + system) per
//                            worker step (its pull and its push);
//   shard RSS and threads    per shard: before any worker connects, with W
//                            workers connected (channels up, nothing
//                            registered), with W workers registered (no
//                            step yet), and the peak under load; per
//                            connection = (connected - before) / W, per
//                            worker = (registered - connected) / W.
// Then, per policy, each figure relative to the smallest W
// (growth lines), and p99 push at the largest W over the smallest.
//
// Build with -c opt (tests/bench/run_benchmarks.sh does):
//   bazel run -c opt //tests/bench:scale_bench -- --workers=4,16,64,256

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "client/ps_client.h"
#include "common/net.h"
#include "tests/testing/subprocess.h"

ABSL_FLAG(std::string, workers, "4,16,64,256",
          "simulated worker counts, comma-separated");
ABSL_FLAG(std::string, policies, "asp,ssp", "asp and/or ssp");
ABSL_FLAG(int, ssp_slack, 3, "slack of the ssp runs");
ABSL_FLAG(int, shards, 2, "ps_server processes");
ABSL_FLAG(double, steps_per_s, 200,
          "aggregate steps per second over all workers (the same for every "
          "W)");
ABSL_FLAG(int64_t, elems, 65536,
          "float32 elements of the tensor each step pulls and pushes");
ABSL_FLAG(double, jitter, 0.5,
          "step period uniform in [1-jitter, 1+jitter] x its mean");
ABSL_FLAG(double, warmup_s, 3, "seconds of load before measuring");
ABSL_FLAG(double, seconds, 10, "seconds measured per run");

namespace asyncps {
namespace {

using SteadyClock = std::chrono::steady_clock;

std::vector<int64_t> Ints(const std::string& csv) {
  std::vector<int64_t> out;
  for (absl::string_view p : absl::StrSplit(csv, ',', absl::SkipEmpty())) {
    int64_t v = 0;
    if (absl::SimpleAtoi(p, &v) && v > 0) out.push_back(v);
  }
  return out;
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(q * v.size()));
  std::nth_element(v.begin(), v.begin() + k, v.end());
  return v[k];
}

// The shards' resources, summed over shards (RSS, threads) at one moment.
struct ShardResources {
  double rss_mib = 0;
  int threads = 0;
  double cpu_s = 0;  // summed over shards
};

absl::StatusOr<ShardResources> Measure(
    const std::vector<testing::ServerProcess>& shards) {
  ShardResources total;
  for (const testing::ServerProcess& s : shards) {
    absl::StatusOr<testing::ProcessResources> r =
        testing::ReadProcessResources(s.process->pid());
    if (!r.ok()) return r.status();
    total.rss_mib += static_cast<double>(r->rss_bytes) / (1 << 20);
    total.threads += r->threads;
    total.cpu_s += r->cpu_seconds;
  }
  total.rss_mib /= static_cast<double>(shards.size());
  total.threads /= static_cast<int>(shards.size());
  return total;
}

// Sum of one counter over the shards' Status.
struct PullCounts {
  uint64_t pulls = 0;
  uint64_t waits = 0;
};

absl::StatusOr<PullCounts> Counts(PsClient* client) {
  absl::StatusOr<std::vector<StatusResponse>> status = client->Status();
  if (!status.ok()) return status.status();
  PullCounts c;
  for (const StatusResponse& s : *status) {
    c.pulls += s.counters().pulls();
    c.waits += s.counters().pull_waits();
  }
  return c;
}

struct RunResult {
  double steps_per_s = 0;
  double mb_per_s = 0;
  double pull_p50_ms = 0, pull_p99_ms = 0;
  double push_p50_ms = 0, push_p99_ms = 0;
  double wait_share = 0;
  double shard_cpu_us_per_step = 0;  // all shards, per worker step
  ShardResources before, connected, registered, peak;
  double rss_per_connection_kib = 0;
  double rss_per_worker_kib = 0;
  double threads_per_connection = 0;
};

// One simulated worker's latencies inside the measured window.
struct WorkerRecord {
  std::vector<double> pull_ms;
  std::vector<double> push_ms;
  int64_t steps = 0;
};

absl::StatusOr<RunResult> RunOne(const std::string& policy, int workers) {
  std::vector<std::string> server_args = {
      absl::StrCat("--consistency=", policy), "--metrics_port=-1",
      "--health_port=-1"};
  if (policy == "ssp") {
    server_args.push_back(
        absl::StrCat("--ssp_slack=", absl::GetFlag(FLAGS_ssp_slack)));
  }
  absl::StatusOr<std::vector<testing::ServerProcess>> shards =
      testing::StartPsCluster(absl::GetFlag(FLAGS_shards), server_args);
  if (!shards.ok()) return shards.status();
  std::vector<std::string> addresses;
  for (const testing::ServerProcess& s : *shards)
    addresses.push_back(s.address);

  const int64_t elems = absl::GetFlag(FLAGS_elems);
  TensorSpec spec;
  spec.set_name("w");
  spec.add_shape(elems);
  spec.set_init(INIT_CONSTANT);
  spec.set_init_value(0.5f);
  spec.mutable_optimizer()->set_type(OPT_SGD);
  spec.mutable_optimizer()->set_learning_rate(1e-3f);

  // The tensor, created by a client that is gone before the baseline.
  {
    PsClientOptions o;
    o.servers = addresses;
    o.worker_id = workers;  // never registers
    absl::StatusOr<std::unique_ptr<PsClient>> setup =
        PsClient::Connect(std::move(o));
    if (!setup.ok()) return setup.status();
    absl::Status s = (*setup)->WaitForShards(absl::Seconds(30));
    if (s.ok()) s = (*setup)->CreateTensors({spec});
    if (!s.ok()) return s;
  }
  absl::SleepFor(absl::Milliseconds(500));
  RunResult result;
  absl::StatusOr<ShardResources> before = Measure(*shards);
  if (!before.ok()) return before.status();
  result.before = *before;

  // Connect every worker (channels up, nothing registered).
  std::vector<std::unique_ptr<PsClient>> clients;
  for (int w = 0; w < workers; ++w) {
    PsClientOptions o;
    o.servers = addresses;
    o.worker_id = w;
    o.connections_per_shard = 1;
    absl::StatusOr<std::unique_ptr<PsClient>> c =
        PsClient::Connect(std::move(o));
    if (!c.ok()) return c.status();
    absl::Status s = (*c)->WaitForShards(absl::Seconds(30));
    if (s.ok()) s = (*c)->WaitForTensors({"w"}, absl::Seconds(30));
    if (!s.ok()) return s;
    clients.push_back(*std::move(c));
  }
  absl::SleepFor(absl::Milliseconds(500));
  absl::StatusOr<ShardResources> connected = Measure(*shards);
  if (!connected.ok()) return connected.status();
  result.connected = *connected;

  // Register each, then run the loop.
  const double mean_period_s =
      static_cast<double>(workers) / absl::GetFlag(FLAGS_steps_per_s);
  const double jitter = std::clamp(absl::GetFlag(FLAGS_jitter), 0.0, 1.0);
  // Set by this thread before `go` is notified.
  SteadyClock::time_point window_begin, window_end;
  absl::Notification go;
  std::atomic<int> registered{0};
  std::atomic<bool> failed{false};
  absl::Mutex error_mu;
  absl::Status error;
  std::vector<WorkerRecord> records(workers);
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      PsClient* c = clients[w].get();
      WorkerRecord& rec = records[w];
      auto fail = [&](const absl::Status& s) {
        absl::MutexLock l(&error_mu);
        if (error.ok()) error = s;
        failed = true;
      };
      absl::StatusOr<Registration> reg = c->Register();
      if (!reg.ok()) return fail(reg.status());
      int64_t clock = reg->resume_clock;
      std::vector<float> params(elems), grad(elems, 1e-4f);
      std::mt19937_64 rng(w + 1);
      std::uniform_real_distribution<double> draw_period(
          mean_period_s * (1 - jitter), mean_period_s * (1 + jitter));
      auto step = [&]() -> absl::Status {
        const auto t0 = SteadyClock::now();
        std::unique_ptr<PsClient::PendingPull> pull =
            c->StartPull(clock, clock, {{"w", params.data()}});
        absl::Status s = pull->Wait();
        if (!s.ok()) return s;
        const auto t1 = SteadyClock::now();
        const auto period = std::chrono::duration_cast<SteadyClock::duration>(
            std::chrono::duration<double>(draw_period(rng)));
        std::this_thread::sleep_until(t0 + period / 2);
        const auto t2 = SteadyClock::now();
        absl::StatusOr<PushSummary> push =
            c->StartPush(clock, {{"w", grad.data()}}, pull->read())->Wait();
        if (!push.ok()) return push.status();
        const auto t3 = SteadyClock::now();
        ++clock;
        std::this_thread::sleep_until(t0 + period);
        if (t3 >= window_begin && t3 < window_end) {
          rec.pull_ms.push_back(
              std::chrono::duration<double, std::milli>(t1 - t0).count());
          rec.push_ms.push_back(
              std::chrono::duration<double, std::milli>(t3 - t2).count());
          ++rec.steps;
        }
        return absl::OkStatus();
      };
      ++registered;
      go.WaitForNotification();
      // Steady state from the start: the workers' steps spread over one
      // compute time instead of all starting at once (the warm-up covers
      // the first steps).
      std::this_thread::sleep_for(std::chrono::duration<double>(
          std::uniform_real_distribution<double>(0, mean_period_s)(rng)));
      while (!failed && SteadyClock::now() < window_end) {
        absl::Status s = step();
        if (!s.ok()) return fail(s);
      }
      // Leave: the shards stop waiting for this worker at once.
      c->Heartbeat(clock, /*leaving=*/true).IgnoreError();
    });
  }
  // Registered, before the load starts.
  const auto deadline = SteadyClock::now() + std::chrono::seconds(120);
  while (registered < workers && !failed && SteadyClock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (registered == workers) {
    absl::StatusOr<ShardResources> r = Measure(*shards);
    if (r.ok()) result.registered = *r;
  } else {
    failed = true;
  }
  window_begin =
      SteadyClock::now() +
      std::chrono::duration_cast<SteadyClock::duration>(
          std::chrono::duration<double>(absl::GetFlag(FLAGS_warmup_s)));
  window_end = window_begin +
               std::chrono::duration_cast<SteadyClock::duration>(
                   std::chrono::duration<double>(absl::GetFlag(FLAGS_seconds)));
  go.Notify();
  // Peak RSS and threads under load, and the shards' pull counters over
  // the window (read by a client that never registers).
  PsClientOptions o;
  o.servers = addresses;
  o.reader = true;
  absl::StatusOr<std::unique_ptr<PsClient>> observer =
      PsClient::Connect(std::move(o));
  if (!observer.ok()) return observer.status();
  std::this_thread::sleep_until(window_begin);
  absl::StatusOr<PullCounts> c0 = Counts(observer->get());
  absl::StatusOr<ShardResources> cpu0 = Measure(*shards);
  while (SteadyClock::now() < window_end && !failed) {
    absl::StatusOr<ShardResources> r = Measure(*shards);
    if (r.ok()) {
      result.peak.rss_mib = std::max(result.peak.rss_mib, r->rss_mib);
      result.peak.threads = std::max(result.peak.threads, r->threads);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  absl::StatusOr<PullCounts> c1 = Counts(observer->get());
  absl::StatusOr<ShardResources> cpu1 = Measure(*shards);
  for (std::thread& t : threads) t.join();
  {
    absl::MutexLock l(&error_mu);
    if (!error.ok()) return error;
  }
  if (registered < workers) {
    return absl::DeadlineExceededError(absl::StrCat(
        registered.load(), " of ", workers, " workers registered in time"));
  }
  if (!c0.ok() || !c1.ok()) return absl::UnavailableError("Status failed");

  std::vector<double> pulls, pushes;
  int64_t steps = 0;
  for (const WorkerRecord& r : records) {
    pulls.insert(pulls.end(), r.pull_ms.begin(), r.pull_ms.end());
    pushes.insert(pushes.end(), r.push_ms.begin(), r.push_ms.end());
    steps += r.steps;
  }
  const double window_s = absl::GetFlag(FLAGS_seconds);
  result.steps_per_s = static_cast<double>(steps) / window_s;
  result.mb_per_s = result.steps_per_s * 2.0 * static_cast<double>(elems) *
                    sizeof(float) / 1e6;
  result.pull_p50_ms = Percentile(pulls, 0.5);
  result.pull_p99_ms = Percentile(pulls, 0.99);
  result.push_p50_ms = Percentile(pushes, 0.5);
  result.push_p99_ms = Percentile(pushes, 0.99);
  const uint64_t dp = c1->pulls - c0->pulls;
  if (cpu0.ok() && cpu1.ok() && steps > 0) {
    result.shard_cpu_us_per_step =
        (cpu1->cpu_s - cpu0->cpu_s) * 1e6 / static_cast<double>(steps);
  }
  result.wait_share =
      dp ? static_cast<double>(c1->waits - c0->waits) / static_cast<double>(dp)
         : 0;
  result.rss_per_connection_kib =
      (result.connected.rss_mib - result.before.rss_mib) * 1024 / workers;
  result.rss_per_worker_kib =
      (result.registered.rss_mib - result.connected.rss_mib) * 1024 / workers;
  result.threads_per_connection =
      static_cast<double>(result.connected.threads - result.before.threads) /
      workers;
  return result;
}

int Main() {
  const std::vector<int64_t> counts = Ints(absl::GetFlag(FLAGS_workers));
  if (counts.empty()) {
    std::fprintf(stderr, "scale_bench: --workers names no count\n");
    return 2;
  }
  std::printf(
      "# %d shards, %.0f steps/s in all, %lld floats pulled and pushed per "
      "step, step period mean = W / steps_per_s, jitter %.2f, %.0f s "
      "measured\n",
      absl::GetFlag(FLAGS_shards), absl::GetFlag(FLAGS_steps_per_s),
      static_cast<long long>(absl::GetFlag(FLAGS_elems)),
      absl::GetFlag(FLAGS_jitter), absl::GetFlag(FLAGS_seconds));
  int rc = 0;
  for (absl::string_view policy :
       absl::StrSplit(absl::GetFlag(FLAGS_policies), ',', absl::SkipEmpty())) {
    std::map<int64_t, RunResult> results;
    for (int64_t w : counts) {
      absl::StatusOr<RunResult> r =
          RunOne(std::string(policy), static_cast<int>(w));
      if (!r.ok()) {
        std::printf("policy=%s workers=%lld FAILED %s\n",
                    std::string(policy).c_str(), static_cast<long long>(w),
                    r.status().ToString().c_str());
        rc = 1;
        continue;
      }
      results[w] = *r;
      std::printf(
          "policy=%s workers=%lld steps_per_s=%.1f mb_per_s=%.1f "
          "pull_p50_ms=%.2f pull_p99_ms=%.2f push_p50_ms=%.2f "
          "push_p99_ms=%.2f ssp_wait_share=%.3f shard_cpu_us_per_step=%.0f "
          "shard_rss_mib=%.1f/%.1f/%.1f/"
          "%.1f (before/connected/registered/peak) shard_threads=%d/%d/%d/%d "
          "rss_per_connection_kib=%.1f rss_per_worker_kib=%.1f "
          "threads_per_connection=%.3f\n",
          std::string(policy).c_str(), static_cast<long long>(w),
          r->steps_per_s, r->mb_per_s, r->pull_p50_ms, r->pull_p99_ms,
          r->push_p50_ms, r->push_p99_ms, r->wait_share,
          r->shard_cpu_us_per_step, r->before.rss_mib, r->connected.rss_mib,
          r->registered.rss_mib, r->peak.rss_mib, r->before.threads,
          r->connected.threads, r->registered.threads, r->peak.threads,
          r->rss_per_connection_kib, r->rss_per_worker_kib,
          r->threads_per_connection);
      std::fflush(stdout);
    }
    if (results.size() < 2) continue;
    const RunResult& base = results.begin()->second;
    const int64_t w0 = results.begin()->first;
    for (const auto& [w, r] : results) {
      auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
      std::printf(
          "growth policy=%s workers=%lld/%lld pull_p99=%.2fx push_p99=%.2fx "
          "peak_rss=%.2fx threads=%.2fx steps_per_s=%.2fx\n",
          std::string(policy).c_str(), static_cast<long long>(w),
          static_cast<long long>(w0), ratio(r.pull_p99_ms, base.pull_p99_ms),
          ratio(r.push_p99_ms, base.push_p99_ms),
          ratio(r.peak.rss_mib, base.peak.rss_mib),
          ratio(r.peak.threads, base.peak.threads),
          ratio(r.steps_per_s, base.steps_per_s));
    }
    const RunResult& last = results.rbegin()->second;
    std::printf(
        "target policy=%s p99_push_w%lld_over_w%lld=%.2f (target <= 4)\n",
        std::string(policy).c_str(),
        static_cast<long long>(results.rbegin()->first),
        static_cast<long long>(w0),
        base.push_p99_ms > 0 ? last.push_p99_ms / base.push_p99_ms : 0.0);
  }
  return rc;
}

}  // namespace
}  // namespace asyncps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  asyncps::TuneProcess();
  return asyncps::Main();
}
