// A worker stand-in for multi-process tests: waits for the named tensors,
// registers (a restarted process of a worker id continues at the data
// position its predecessors reached, whatever clock it resumes at), then
// pulls them and pushes a gradient whose every element is `--grad` until
// the worker id has trained `--pushes` steps (one push each), and finally
// says goodbye. Prints "acked <step>" once each step's push is answered,
// and reports the data position with its next call.
// Exits 0 when every push was applied in full (or acknowledged as the
// duplicate of a push applied before), 1 otherwise (the reason on stderr).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/ps_client.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/tensor_layout.h"
#include "membership/etcd_flags.h"
#include "membership/shard_addressing.h"

ABSL_FLAG(std::string, servers, "", "Shard addresses, host:port,...");
ABSL_FLAG(int, worker_id, 0, "This worker's id.");
ABSL_FLAG(int, pushes, 10, "Pull + push rounds.");
ABSL_FLAG(double, grad, 1.0, "Value of every gradient element.");
ABSL_FLAG(bool, steps, false,
          "Send each push with the next round's pull (PsClient::PushThenPull, "
          "one StepStream request per shard) instead of a pull and a push.");
ABSL_FLAG(std::string, tensors, "", "Tensors to push to, name,name,...");
ABSL_FLAG(int, wait_timeout_s, 60, "How long to wait for the tensors.");
ABSL_FLAG(std::string, run_id, "", "The shards' --run_id.");
ABSL_FLAG(int64_t, create_elems, 0,
          "If > 0, first creates the --tensors (this many elements, slices of "
          "100, constant 1, SGD with rate 1) unless they exist.");
ABSL_FLAG(double, expect, std::nan(""),
          "If set, after its pushes reads every element of the tensors and "
          "exits 1 unless each equals this value exactly.");
ABSL_FLAG(bool, print_value, false,
          "After its pushes, reads the tensors and prints `value NAME V` for "
          "each whose elements all equal V, else exits 1.");
ABSL_FLAG(std::string, log_level, "info", "trace|debug|info|warn|error|off");

namespace asyncps {
namespace {

absl::Status Run() {
  absl::StatusOr<std::shared_ptr<spdlog::logger>> logger =
      MakeLogger("push_client", absl::GetFlag(FLAGS_log_level));
  if (!logger.ok()) return logger.status();
  // --servers, or (--etcd_endpoints) the run's shard map, followed through
  // failovers.
  ShardAddressingOptions a;
  a.servers = absl::GetFlag(FLAGS_servers);
  std::vector<std::string> warnings;
  if (absl::Status s = AddEtcdFlags(&a, &warnings); !s.ok()) return s;
  for (const std::string& w : warnings) (*logger)->warn("{}", w);
  a.run_id = absl::GetFlag(FLAGS_run_id);
  absl::StatusOr<ShardAddressing> shards = ResolveShardAddressing(a);
  if (!shards.ok()) return shards.status();
  const std::vector<std::string> names =
      absl::StrSplit(absl::GetFlag(FLAGS_tensors), ',', absl::SkipEmpty());
  if (names.empty()) return absl::InvalidArgumentError("--tensors is empty");

  PsClientOptions options;
  options.servers = shards->servers;
  options.router = shards->router;
  options.worker_id = absl::GetFlag(FLAGS_worker_id);
  options.run_id = absl::GetFlag(FLAGS_run_id);
  options.logger = *logger;
  absl::StatusOr<std::unique_ptr<PsClient>> client =
      PsClient::Connect(std::move(options));
  if (!client.ok()) return client.status();
  PsClient& ps = **client;
  if (absl::GetFlag(FLAGS_create_elems) > 0) {
    std::vector<TensorSpec> specs;
    for (const std::string& name : names) {
      TensorSpec t;
      t.set_name(name);
      t.add_shape(absl::GetFlag(FLAGS_create_elems));
      t.set_init(INIT_CONSTANT);
      t.set_init_value(1.0f);
      t.set_slice_elems(100);
      t.mutable_optimizer()->set_learning_rate(1.0f);
      specs.push_back(t);
    }
    absl::Status created = ps.CreateTensors(specs);
    if (!created.ok()) return created;
  }
  absl::Status s = ps.WaitForTensors(
      names, absl::Seconds(absl::GetFlag(FLAGS_wait_timeout_s)));
  if (!s.ok()) return s;

  std::vector<std::vector<float>> params, grads;
  std::vector<std::pair<std::string, float*>> pull_into;
  std::vector<std::pair<std::string, const float*>> push_from;
  int64_t slices = 0;
  for (const std::string& name : names) {
    absl::StatusOr<TensorLayout> layout =
        TensorLayout::FromSpec(*ps.FindSpec(name));
    if (!layout.ok()) return layout.status();
    slices += layout->num_slices();
    params.emplace_back(layout->num_elems());
    grads.emplace_back(layout->num_elems(),
                       static_cast<float>(absl::GetFlag(FLAGS_grad)));
  }
  for (size_t k = 0; k < names.size(); ++k) {
    pull_into.emplace_back(names[k], params[k].data());
    push_from.emplace_back(names[k], grads[k].data());
  }

  absl::StatusOr<Registration> reg = ps.Register();
  if (!reg.ok()) return reg.status();
  const int pushes = absl::GetFlag(FLAGS_pushes);
  uint64_t max_staleness = 0;
  int64_t clock = reg->resume_clock;
  const bool steps = absl::GetFlag(FLAGS_steps);
  PushSet push_set;
  push_set.tensors = push_from;
  for (int64_t step = reg->trained; step < pushes; ++step, ++clock) {
    // With --steps the pull of every round but the first came with the
    // push before it.
    if (!steps || step == reg->trained) {
      s = ps.Pull(clock, pull_into);
      if (!s.ok()) return s;
    }
    absl::StatusOr<PushSummary> summary =
        steps ? ps.PushThenPull(clock, push_set, pull_into)
              : ps.Push(clock, push_from);
    if (!summary.ok()) return summary.status();
    // A shard whose answer was lost answers the retry as a duplicate.
    if ((summary->applied != slices && summary->duplicates == 0) ||
        summary->refused_stale != 0 || summary->refused_restored != 0) {
      return absl::InternalError(absl::StrCat(
          "push of step ", step, ": applied ", summary->applied, " of ", slices,
          " slices, refused ", summary->refused_stale, " + ",
          summary->refused_restored, ", duplicates ", summary->duplicates));
    }
    ps.ReportTrained(step + 1);
    std::printf("acked %ld\n", static_cast<long>(step));
    std::fflush(stdout);
    max_staleness = std::max(max_staleness, summary->max_staleness);
  }
  const double expect = absl::GetFlag(FLAGS_expect);
  if (!std::isnan(expect)) {
    s = ps.Pull(clock, pull_into);
    if (!s.ok()) return s;
    for (size_t k = 0; k < names.size(); ++k) {
      for (size_t i = 0; i < params[k].size(); ++i) {
        if (params[k][i] != static_cast<float>(expect)) {
          return absl::DataLossError(absl::StrCat(
              names[k], "[", i, "] is ", params[k][i], ", expected ", expect));
        }
      }
    }
    std::printf("verified %zu tensor(s) equal %g\n", names.size(), expect);
  }
  if (absl::GetFlag(FLAGS_print_value)) {
    s = ps.Pull(clock, pull_into);
    if (!s.ok()) return s;
    for (size_t k = 0; k < names.size(); ++k) {
      for (const float v : params[k]) {
        if (v != params[k][0]) {
          return absl::DataLossError(
              absl::StrCat("the elements of ", names[k], " differ"));
        }
      }
      std::printf("value %s %.9g\n", names[k].c_str(),
                  params[k].empty() ? 0.0 : params[k][0]);
    }
  }
  s = ps.Heartbeat(clock, /*leaving=*/true);
  if (!s.ok()) return s;
  (*logger)->info("worker {}: {} pushes of {} slices applied, max staleness {}",
                  ps.worker_id(), pushes, slices, max_staleness);
  return absl::OkStatus();
}

}  // namespace
}  // namespace asyncps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status s = asyncps::Run();
  if (!s.ok()) {
    std::fprintf(stderr, "push_client: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
