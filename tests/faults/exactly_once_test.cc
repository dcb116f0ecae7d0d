// Exactly-once pushes under faults, with real processes: three pushers send
// constant gradients to two shards through TCP proxies that lose answers
// (the shard applied the push, the pusher never hears so and retries), and
// one pusher is killed with SIGKILL twice and restarted, each time after
// its current process saw 3 acknowledgements (events, not timing: a
// restarted pusher continues at its data position, so each process has
// pushes left whatever its peers did). Every push a pusher saw
// acknowledged is applied exactly once, and nothing else is: the
// parameters equal init - sum(gradient x pushes applied) exactly, every
// slice's version equals the pushes applied, each pusher's applied count
// is its acknowledged count (plus at most one unacknowledged push per
// kill), and every step of every pusher was acknowledged (a step is
// pushed again only after a kill, at most once per kill).

#include <signal.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/ps_client.h"
#include "common/shard_map.h"
#include "common/tensor_layout.h"
#include "tests/faults/harness.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/tcp_proxy.h"

namespace asyncps {
namespace {

using testing::RunfilePath;
using testing::ServerProcess;
using testing::StartPsCluster;
using testing::Subprocess;
using testing::TcpProxy;

// The steps of the "acked <step>" lines of a pusher's log, in order.
std::vector<int64_t> AckedSteps(const std::string& log) {
  std::vector<int64_t> steps;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    int64_t step;
    if (absl::ConsumePrefix(&line, "acked ") && absl::SimpleAtoi(line, &step)) {
      steps.push_back(step);
    }
  }
  return steps;
}

// Waits until `pusher` has acknowledged `n` pushes of its own. Polls often:
// an unhindered pusher acknowledges a push about every millisecond.
absl::Status WaitForAcks(Subprocess* pusher, int n, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (static_cast<int>(AckedSteps(pusher->ReadLog()).size()) < n) {
    if (!pusher->Running()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "pusher exited before ", n, " acks:\n", pusher->LogTail()));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "pusher acknowledged fewer than ", n, " pushes in ",
          absl::FormatDuration(timeout), ":\n", pusher->LogTail()));
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  return absl::OkStatus();
}

TEST_CASE(
    "pushes are applied exactly once through lost answers and killed "
    "pushers",
    "[faults][dedup]") {
  constexpr int kShards = 2;
  constexpr int kPushers = 3;
  constexpr int kPushes = 60;
  constexpr float kInit = 1.0f;
  absl::StatusOr<std::vector<ServerProcess>> cluster =
      StartPsCluster(kShards, {"--log_level=warn"});
  REQUIRE_OK(cluster.status());
  std::vector<std::unique_ptr<TcpProxy>> proxies;
  std::vector<std::string> via;
  for (const ServerProcess& s : *cluster) {
    absl::StatusOr<std::unique_ptr<TcpProxy>> p = TcpProxy::Start(s.address);
    REQUIRE_OK(p.status());
    via.push_back((*p)->address());
    proxies.push_back(*std::move(p));
  }

  // 2000 floats in slices of 256 over both shards: a push is a little under
  // 4 KiB per shard.
  TensorSpec spec;
  spec.set_name("w");
  spec.add_shape(2000);
  spec.set_init(INIT_CONSTANT);
  spec.set_init_value(kInit);
  spec.set_slice_elems(256);
  spec.mutable_optimizer()->set_learning_rate(1.0f);
  PsClientOptions o;
  o.servers = {(*cluster)[0].address, (*cluster)[1].address};
  o.worker_id = 100;
  absl::StatusOr<std::unique_ptr<PsClient>> admin = PsClient::Connect(o);
  REQUIRE_OK(admin.status());
  REQUIRE_OK((*admin)->CreateTensors({spec}));

  auto start = [&](int w) {
    absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Start(
        RunfilePath("tests/integration/push_client"),
        {absl::StrCat("--servers=", via[0], ",", via[1]),
         absl::StrCat("--worker_id=", w), absl::StrCat("--pushes=", kPushes),
         absl::StrCat("--grad=", w + 1), "--tensors=w", "--log_level=warn"});
    REQUIRE_OK(p.status());
    return *std::move(p);
  };
  std::vector<std::unique_ptr<Subprocess>> pushers;
  for (int w = 0; w < kPushers; ++w) pushers.push_back(start(w));
  std::vector<std::string> logs(kPushers);

  // Answers go missing every now and then, on both shards.
  for (auto& p : proxies) p->LoseNextAnswers(4, /*min_request_bytes=*/1000);
  // Pusher 2 is killed twice mid-run and started again.
  int kills = 0;
  for (int round = 0; round < 2; ++round) {
    REQUIRE_OK(WaitForAcks(pushers[2].get(), 3, absl::Seconds(60)));
    REQUIRE_OK(pushers[2]->Signal(SIGKILL));
    absl::StatusOr<int> code = pushers[2]->Wait(absl::Seconds(10));
    REQUIRE_OK(code.status());
    REQUIRE(*code == -SIGKILL);  // killed mid-run, not finished first
    ++kills;
    logs[2] += pushers[2]->ReadLog();
    pushers[2] = start(2);
  }
  for (int w = 0; w < kPushers; ++w) {
    absl::StatusOr<int> code = pushers[w]->Wait(absl::Minutes(2));
    INFO("pusher " << w << ":\n" << pushers[w]->LogTail());
    REQUIRE_OK(code.status());
    REQUIRE(*code == 0);
    logs[w] += pushers[w]->ReadLog();
  }
  int lost = 0;
  for (auto& p : proxies) lost += p->answers_lost();
  CHECK(lost > 0);

  // What each shard applied of each pusher. A push is acknowledged once
  // every shard applied it; a pusher killed mid-push may have reached only
  // some shards with it (its successor continues after it), so the killed
  // pusher's count may differ between shards by the kills, never more.
  absl::StatusOr<std::vector<StatusResponse>> status = (*admin)->Status();
  REQUIRE_OK(status.status());
  std::vector<std::vector<int64_t>> applied(kShards,
                                            std::vector<int64_t>(kPushers));
  uint64_t duplicates = 0;
  for (int s = 0; s < kShards; ++s) {
    for (int w = 0; w < kPushers; ++w) {
      const WorkerStatus* ws = testing::FindWorker((*status)[s], w);
      REQUIRE(ws != nullptr);
      applied[s][w] = static_cast<int64_t>(ws->pushes());
    }
    duplicates += (*status)[s].counters().duplicate_pushes();
  }
  INFO("answers lost " << lost << ", duplicates acknowledged " << duplicates);
  for (int w = 0; w < kPushers; ++w) {
    INFO("pusher " << w);
    const std::vector<int64_t> steps = AckedSteps(logs[w]);
    REQUIRE(!steps.empty());
    CHECK(steps.back() == kPushes - 1);  // the last process finished
    const int killed = w == 2 ? kills : 0;
    // Every step acknowledged; a step again only after a kill.
    const absl::flat_hash_set<int64_t> distinct(steps.begin(), steps.end());
    CHECK(distinct.size() == static_cast<size_t>(kPushes));
    const int64_t acked = static_cast<int64_t>(steps.size());
    CHECK(acked >= kPushes);
    CHECK(acked <= kPushes + killed);
    for (int s = 0; s < kShards; ++s) {
      // Each kill may leave one push applied but never acknowledged.
      CHECK(applied[s][w] >= acked);
      CHECK(applied[s][w] <= acked + killed);
    }
  }
  // The values and versions of every slice: exactly what its shard applied,
  // each push once.
  std::vector<float> values(2000);
  REQUIRE_OK((*admin)->Pull(0, {{"w", values.data()}}));
  const std::vector<uint64_t> versions = (*admin)->PulledVersions("w");
  const TensorLayout layout = *TensorLayout::FromSpec(*(*admin)->FindSpec("w"));
  REQUIRE(versions.size() == layout.num_slices());
  for (uint32_t i = 0; i < layout.num_slices(); ++i) {
    const int home = ShardMap::Static(kShards)->SliceHome("w", i);
    float expected = kInit;
    int64_t total = 0;
    for (int w = 0; w < kPushers; ++w) {
      expected -= static_cast<float>(w + 1) * applied[home][w];
      total += applied[home][w];
    }
    INFO("slice " << i << " on shard " << home);
    CHECK(versions[i] == static_cast<uint64_t>(total));
    for (int64_t e = layout.SliceBegin(i);
         e < layout.SliceBegin(i) + layout.SliceSize(i); ++e) {
      REQUIRE(values[e] == expected);
    }
  }
  CHECK(kills == 2);
}

}  // namespace
}  // namespace asyncps
