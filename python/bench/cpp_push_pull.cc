// cpp_push_pull: the C++ side of python/bench/push_pull_bench.py and
// message_cost.py. Times PsClient::Pull or PsClient::Push of one existing
// tensor (or a Heartbeat, an RPC without payload) in a loop and prints one
// line, with the process's CPU time per call:
//   op=pull impl=cpp bytes=4194304 calls=812 seconds=1.002 mb_per_s=3399.1
//   cpu_us_per_call=1020.3
// The Python scripts run it against the same shards, interleaved with the
// same loop through the Python binding, so both see the same conditions.

#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/ps_client.h"
#include "common/net.h"

ABSL_FLAG(std::string, servers, "", "shard addresses h:p,h:p");
ABSL_FLAG(std::string, tensor, "bench", "name of the existing tensor");
ABSL_FLAG(std::string, op, "pull", "pull, push or heartbeat");
ABSL_FLAG(double, seconds, 1.0, "length of the timed loop");
ABSL_FLAG(int, max_iters, 100000, "most calls in the timed loop");
ABSL_FLAG(int, worker_id, 1, "worker id of this client");
ABSL_FLAG(bool, tune_malloc, true, "TuneMallocForLargeMessages() first");

namespace asyncps {
namespace {

// User + system CPU seconds of this process so far.
double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

int Run() {
  if (absl::GetFlag(FLAGS_tune_malloc)) TuneMallocForLargeMessages();
  absl::StatusOr<std::vector<std::string>> servers =
      ParseServerList(absl::GetFlag(FLAGS_servers));
  const std::string op = absl::GetFlag(FLAGS_op);
  if (!servers.ok() || (op != "pull" && op != "push" && op != "heartbeat")) {
    std::fprintf(stderr,
                 "usage: cpp_push_pull --servers=h:p,... "
                 "--op=pull|push|heartbeat [--tensor=NAME]\n");
    return 2;
  }
  PsClientOptions options;
  options.servers = *servers;
  options.worker_id = absl::GetFlag(FLAGS_worker_id);
  absl::StatusOr<std::unique_ptr<PsClient>> client =
      PsClient::Connect(std::move(options));
  const std::string name = absl::GetFlag(FLAGS_tensor);
  absl::Status s = client.ok()
                       ? (*client)->WaitForTensors({name}, absl::Seconds(30))
                       : client.status();
  if (!s.ok()) {
    std::fprintf(stderr, "cpp_push_pull: %s\n", s.ToString().c_str());
    return 1;
  }
  PsClient& c = **client;
  int64_t elems = 1;
  for (int64_t d : c.FindSpec(name)->shape()) elems *= d;
  std::vector<float> buffer(elems, 0.0f);
  int64_t clock = 0;
  auto call = [&]() -> absl::Status {
    if (op == "pull") return c.Pull(clock, {{name, buffer.data()}});
    if (op == "heartbeat") return c.Heartbeat(clock, /*leaving=*/false);
    return c.Push(clock, {{name, buffer.data()}}).status();
  };
  // Untimed: the first pull also records versions for the pushes.
  for (int i = 0; i < 2 && s.ok(); ++i)
    s = c.Pull(clock, {{name, buffer.data()}});
  for (int i = 0; i < 2 && s.ok(); ++i) s = call();
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  const double cpu_start = ProcessCpuSeconds();
  double elapsed = 0;
  int64_t calls = 0;
  while (s.ok() && calls < absl::GetFlag(FLAGS_max_iters) &&
         elapsed < absl::GetFlag(FLAGS_seconds)) {
    s = call();
    ++calls;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  }
  if (!s.ok()) {
    std::fprintf(stderr, "cpp_push_pull: %s\n", s.ToString().c_str());
    return 1;
  }
  const double cpu = ProcessCpuSeconds() - cpu_start;
  const double bytes = static_cast<double>(elems) * sizeof(float);
  std::printf(
      "op=%s impl=cpp bytes=%.0f calls=%lld seconds=%.3f "
      "mb_per_s=%.1f cpu_us_per_call=%.1f\n",
      op.c_str(), bytes, static_cast<long long>(calls), elapsed,
      bytes * calls / elapsed / 1e6, 1e6 * cpu / static_cast<double>(calls));
  (void)c.Heartbeat(clock, /*leaving=*/true);
  return 0;
}

}  // namespace
}  // namespace asyncps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return asyncps::Run();
}
