// run_view_bench: what following a replicated run's map and members costs
// etcd, per server process, as the run grows. Every server process of a
// run with etcd keeps a RunView (membership/run_view.h) that its role
// thread reads every tick; this benchmark plays --processes such processes
// (each its own EtcdClient, so its own connection, watch and lease-free
// member key under one run's prefix) against one real etcd, reading every
// view every --tick, and measures etcd's CPU and its Range calls.
//
// Two ways of keeping a view fresh alternate in every repetition, in one
// etcd:
//   relist:   the view listed the whole prefix every second under its
//             watch (RunView's relist_every 1 s; the watch never checked)
//   progress: the watch asks etcd for progress when it has heard nothing
//             for a second and ends when that goes unanswered
//             (EtcdClientOptions::watch_check_every), the view lists once
//             a minute (the defaults)
// After each round every view must hold the run's map and every member.
//
// Output: one "key=value ..." line per round, then the medians and
// ratio_progress_over_relist for etcd's CPU.

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "membership/map_store.h"
#include "membership/run_view.h"
#include "tests/bench/bench_util.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/shard_maps.h"
#include "tests/testing/subprocess.h"

ABSL_FLAG(int, processes, 200, "server processes played (views, members)");
ABSL_FLAG(int, seconds, 10, "seconds per round");
ABSL_FLAG(int, reps, 3, "repetitions (the two ways alternate in each)");
ABSL_FLAG(int, tick_ms, 50, "how often each view is read (a role tick)");

namespace asyncps {
namespace {

void Die(const absl::Status& s) {
  std::fprintf(stderr, "run_view_bench: %s\n", s.ToString().c_str());
  std::exit(1);
}

template <typename T>
T Check(absl::StatusOr<T> v) {
  if (!v.ok()) Die(v.status());
  return *std::move(v);
}

struct Process {
  std::shared_ptr<EtcdClient> etcd;
  std::unique_ptr<RunView> view;
};

struct Round {
  double etcd_cores = 0;  // etcd's CPU seconds per second
  double ranges_per_s = 0;
  int64_t listings = 0;
};

Round RunRound(const testing::EtcdProcess& etcd, const std::string& prefix,
               bool progress) {
  const int n = absl::GetFlag(FLAGS_processes);
  std::vector<Process> processes(n);
  for (Process& p : processes) {
    EtcdClientOptions o;
    o.call_timeout = absl::Seconds(3);  // ps_server's
    if (!progress) o.watch_check_every = absl::ZeroDuration();
    p.etcd = Check(testing::ConnectToEtcd(etcd, o));
    p.view = progress ? std::make_unique<RunView>(p.etcd.get(), prefix)
                      : std::make_unique<RunView>(p.etcd.get(), prefix,
                                                  absl::Seconds(1));
    Check(p.view->Read());  // listed and watching before the clock starts
  }
  const absl::Duration tick = absl::Milliseconds(absl::GetFlag(FLAGS_tick_ms));
  const int64_t ranges0 = Check(testing::EtcdCallsStarted(etcd, "Range"));
  const double cpu0 =
      Check(testing::ReadProcessResources(etcd.process->pid())).cpu_seconds;
  const absl::Time start = absl::Now();
  const absl::Time end = start + absl::Seconds(absl::GetFlag(FLAGS_seconds));
  for (absl::Time next = start; next < end; next += tick) {
    for (Process& p : processes) Check(p.view->Read());
    absl::SleepFor(next + tick - absl::Now());
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  Round r;
  r.etcd_cores =
      (Check(testing::ReadProcessResources(etcd.process->pid())).cpu_seconds -
       cpu0) /
      seconds;
  r.ranges_per_s =
      (Check(testing::EtcdCallsStarted(etcd, "Range")) - ranges0) / seconds;
  for (Process& p : processes) {
    const RunView::Snapshot s = Check(p.view->Read());
    if (static_cast<int>(s.live.size()) != n || s.map.epoch() != 1) {
      Die(absl::InternalError(absl::StrCat("a view holds ", s.live.size(),
                                           " members of ", n, ", map epoch ",
                                           s.map.epoch())));
    }
    r.listings += p.view->listings();
  }
  return r;
}

int Main() {
  const int n = absl::GetFlag(FLAGS_processes);
  testing::EtcdProcess etcd = Check(testing::StartEtcd());
  std::shared_ptr<EtcdClient> admin = Check(testing::ConnectToEtcd(etcd));
  const std::string prefix = RunPrefix("bench");
  Check(
      MapStore(admin.get(), prefix).Initialize(testing::TwoByTwoMap("bench")));
  for (int i = 0; i < n; ++i) {
    // As ps_server registers: <prefix>/members/<address>, "shard=S host=H".
    Check(admin->Put(
        absl::StrCat(prefix, "/members/10.0.", i / 256, ".", i % 256, ":7000"),
        absl::StrCat("shard=", i / 2, " host=node-", i)));
  }
  std::map<std::string, std::vector<Round>> rounds;
  for (int rep = 0; rep < absl::GetFlag(FLAGS_reps); ++rep) {
    for (const bool progress : {false, true}) {
      const std::string way = progress ? "progress" : "relist";
      const Round r = RunRound(etcd, prefix, progress);
      rounds[way].push_back(r);
      std::printf(
          "way=%s rep=%d processes=%d etcd_cores=%.4f ranges_per_s=%.1f "
          "listings=%lld\n",
          way.c_str(), rep, n, r.etcd_cores, r.ranges_per_s,
          static_cast<long long>(r.listings));
      std::fflush(stdout);
    }
  }
  std::map<std::string, double> cores;
  for (const auto& [way, rs] : rounds) {
    std::vector<double> c, q;
    for (const Round& r : rs) {
      c.push_back(r.etcd_cores);
      q.push_back(r.ranges_per_s);
    }
    cores[way] = Median(c);
    std::printf("way=%s median_etcd_cores=%.4f median_ranges_per_s=%.1f\n",
                way.c_str(), Median(c), Median(q));
  }
  std::printf("ratio_progress_over_relist=%.3f\n",
              cores["progress"] / std::max(cores["relist"], 1e-9));
  return 0;
}

}  // namespace
}  // namespace asyncps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return asyncps::Main();
}
