// Liveness with real processes: a worker that dies while its SSP pull waits
// stops holding its peers back after one lease (its wait is dropped when its
// connection closes), not after the pull wait timeout; ps_worker stops
// cleanly on SIGTERM (drains its pushes, leaves the shards, exits 143: its
// share is not trained), also out of a pull that waits on BSP, and at once
// on a second signal; ps_server stops promptly with clients still
// connected, writing its final checkpoint; a worker started before its
// shards waits for them, and a signal ends that wait.

#include <signal.h>

#include <catch2/catch.hpp>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/ps_client.h"
#include "tests/faults/harness.h"
#include "tests/testing/require_ok.h"

namespace asyncps {
namespace {

using testing::FindWorker;
using testing::ServerList;
using testing::ServerProcess;
using testing::ShardStatus;
using testing::StartPsCluster;
using testing::StartPsServer;
using testing::StartWorker;
using testing::Subprocess;
using testing::WaitForLog;

std::unique_ptr<Subprocess> Worker(const std::string& servers, int id,
                                   std::vector<std::string> extra,
                                   int num_workers = 2) {
  std::vector<std::string> args = {absl::StrCat("--servers=", servers),
                                   absl::StrCat("--worker_id=", id),
                                   absl::StrCat("--num_workers=", num_workers),
                                   "--hidden=32",
                                   "--log_every_steps=20",
                                   "--evaluate=false"};
  args.insert(args.end(), extra.begin(), extra.end());
  absl::StatusOr<std::unique_ptr<Subprocess>> p = StartWorker(args);
  REQUIRE_OK(p.status());
  return *std::move(p);
}

// Polls the shard until `ready(status)` holds (deadline 60 s).
void WaitForStatus(const std::string& address,
                   const std::function<bool(const StatusResponse&)>& ready) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (;;) {
    absl::StatusOr<StatusResponse> st = ShardStatus(address);
    REQUIRE_OK(st.status());
    if (ready(*st)) return;
    REQUIRE(absl::Now() < deadline);
    absl::SleepFor(absl::Milliseconds(20));
  }
}

TEST_CASE(
    "a worker that dies while its SSP pull waits holds its peers back "
    "for one lease, not the wait timeout",
    "[faults][ssp]") {
  absl::StatusOr<std::vector<ServerProcess>> cluster = StartPsCluster(
      1, {"--consistency=ssp", "--ssp_slack=1", "--worker_lease_ms=3000",
          "--pull_wait_timeout_ms=600000"});
  REQUIRE_OK(cluster.status());
  const std::string address = (*cluster)[0].address;
  std::unique_ptr<Subprocess> fast = Worker(address, 0, {"--steps=100000"});
  std::unique_ptr<Subprocess> slow = Worker(address, 1, {"--steps=300"});
  WaitForStatus(address, [](const StatusResponse& st) {
    const WorkerStatus* w = FindWorker(st, 1);
    return w != nullptr && w->clock() > 20;
  });
  // Worker 1 freezes: worker 0 runs into the slack and its pull waits.
  // Then worker 0 dies in that wait.
  REQUIRE_OK(slow->Signal(SIGSTOP));
  WaitForStatus(address, [](const StatusResponse& st) {
    return FindWorker(st, 0)->waiting_pulls() > 0;
  });
  REQUIRE_OK(fast->Signal(SIGKILL));
  REQUIRE_OK(fast->Wait(absl::Seconds(10)).status());
  // Its connection closed: the wait is dropped at once.
  WaitForStatus(address, [](const StatusResponse& st) {
    return st.counters().cancelled_pulls() >= 1;
  });
  REQUIRE_OK(slow->Signal(SIGCONT));

  // Worker 1 passes the dead one's clock and finishes: its pulls waited at
  // most about a lease for the dead worker, never the 10 minutes of
  // --pull_wait_timeout_ms.
  absl::StatusOr<int> code = slow->Wait(absl::Minutes(2));
  INFO(slow->LogTail());
  REQUIRE_OK(code.status());
  CHECK(*code == 0);
  absl::StatusOr<StatusResponse> st = ShardStatus(address);
  REQUIRE_OK(st.status());
  CHECK(st->counters().pull_wait_timeouts() == 0);
  const WorkerStatus* dead = FindWorker(*st, 0);
  REQUIRE(dead != nullptr);
  CHECK_FALSE(dead->live());
  CHECK(dead->waiting_pulls() == 0);
  CHECK(FindWorker(*st, 1)->clock() > dead->clock() + 1);
}

TEST_CASE(
    "ps_worker stops on SIGTERM, drains, leaves and exits 143, also out of a "
    "BSP wait; a second signal exits at once",
    "[faults][signals]") {
  absl::StatusOr<ServerProcess> shard =
      StartPsServer(0, 1,
                    {"--consistency=bsp", "--pull_wait_timeout_ms=600000",
                     "--worker_lease_ms=600000"});
  REQUIRE_OK(shard.status());
  {
    std::unique_ptr<Subprocess> w =
        Worker(shard->address, 0, {"--steps=1000000"}, /*num_workers=*/1);
    REQUIRE_OK(WaitForLog(w.get(), "train_acc", absl::Seconds(60)));
    REQUIRE_OK(w->Signal(SIGTERM));
    absl::StatusOr<int> code = w->Wait(absl::Seconds(30));
    INFO(w->LogTail());
    REQUIRE_OK(code.status());
    CHECK(*code == 128 + SIGTERM);
    CHECK(absl::StrContains(w->ReadLog(), "stopped early"));
    absl::StatusOr<StatusResponse> st = ShardStatus(shard->address);
    REQUIRE_OK(st.status());
    const WorkerStatus* ws = FindWorker(*st, 0);
    REQUIRE(ws != nullptr);
    CHECK(ws->left());
    // Every step it trained was acknowledged and recorded before it left.
    CHECK(ws->trained() == static_cast<int64_t>(ws->pushes()));
  }
  // A worker stuck in a BSP pull (worker 7 is registered and never moves):
  // the signal ends the wait at once; the worker leaves and exits 143.
  PsClientOptions o;
  o.servers = {shard->address};
  o.worker_id = 7;
  absl::StatusOr<std::unique_ptr<PsClient>> idle = PsClient::Connect(o);
  REQUIRE_OK(idle.status());
  REQUIRE_OK((*idle)->Register().status());
  std::unique_ptr<Subprocess> stuck =
      Worker(shard->address, 1, {"--steps=1000"});
  WaitForStatus(shard->address, [](const StatusResponse& st) {
    const WorkerStatus* w = FindWorker(st, 1);
    return w != nullptr && w->waiting_pulls() > 0;
  });
  REQUIRE_OK(stuck->Signal(SIGTERM));
  absl::StatusOr<int> code = stuck->Wait(absl::Seconds(20));
  INFO(stuck->LogTail());
  REQUIRE_OK(code.status());
  CHECK(*code == 128 + SIGTERM);
  CHECK(absl::StrContains(stuck->ReadLog(), "stopped early"));
  WaitForStatus(shard->address, [](const StatusResponse& st) {
    const WorkerStatus* w = FindWorker(st, 1);
    return w != nullptr && w->left() && w->waiting_pulls() == 0;
  });

  // A worker whose shard is frozen (SIGSTOP) cannot drain its pushes or
  // leave: the first signal cannot end that, a second one exits at once.
  absl::StatusOr<ServerProcess> frozen = StartPsServer(0, 1);
  REQUIRE_OK(frozen.status());
  std::unique_ptr<Subprocess> draining =
      Worker(frozen->address, 0, {"--steps=1000000"}, /*num_workers=*/1);
  REQUIRE_OK(WaitForLog(draining.get(), "train_acc", absl::Seconds(60)));
  REQUIRE_OK(frozen->process->Signal(SIGSTOP));
  REQUIRE_OK(draining->Signal(SIGTERM));
  REQUIRE_OK(WaitForLog(draining.get(), "send it again to exit at once",
                        absl::Seconds(10)));
  absl::SleepFor(absl::Milliseconds(500));
  CHECK(draining->Running());
  REQUIRE_OK(draining->Signal(SIGINT));
  absl::StatusOr<int> drained = draining->Wait(absl::Seconds(10));
  REQUIRE_OK(frozen->process->Signal(SIGCONT));
  REQUIRE_OK(drained.status());
  CHECK(*drained == 128 + SIGINT);
}

TEST_CASE(
    "ps_server stops promptly with clients connected and writes its "
    "final checkpoint",
    "[faults][signals]") {
  const std::string dir = testing::UniqueTmpPath("ckpt");
  absl::StatusOr<ServerProcess> shard =
      StartPsServer(0, 1, {absl::StrCat("--checkpoint_dir=", dir)});
  REQUIRE_OK(shard.status());
  // A client with open streams and an idle channel.
  PsClientOptions o;
  o.servers = {shard->address};
  absl::StatusOr<std::unique_ptr<PsClient>> client = PsClient::Connect(o);
  REQUIRE_OK(client.status());
  TensorSpec spec;
  spec.set_name("w");
  spec.add_shape(1000);
  spec.mutable_optimizer()->set_learning_rate(1.0f);
  REQUIRE_OK((*client)->CreateTensors({spec}));
  std::vector<float> w(1000), g(1000, 1.0f);
  REQUIRE_OK((*client)->Pull(0, {{"w", w.data()}}));
  REQUIRE_OK((*client)->Push(0, {{"w", g.data()}}).status());

  REQUIRE_OK(shard->process->Signal(SIGTERM));
  absl::StatusOr<int> code = shard->process->Wait(absl::Seconds(20));
  const std::string log = shard->process->ReadLog();
  INFO(log);
  REQUIRE_OK(code.status());
  CHECK(*code == 0);
  CHECK(absl::StrContains(log, "checkpoint written"));
  // How long the stop took, as the shard logs it.
  std::smatch m;
  static const std::regex re("shard stopped in ([0-9.]+)(ms|s)");
  REQUIRE(std::regex_search(log, m, re));
}

TEST_CASE("a worker started before its shards waits for them, naming them",
          "[faults][start_order]") {
  absl::StatusOr<std::string> a0 = testing::UnusedLoopbackAddress();
  absl::StatusOr<std::string> a1 = testing::UnusedLoopbackAddress();
  REQUIRE_OK(a0.status());
  REQUIRE_OK(a1.status());
  const int p0 = testing::PortOf(*a0), p1 = testing::PortOf(*a1);
  const std::string list = absl::StrCat(*a0, ",", *a1);
  std::vector<std::string> args = {absl::StrCat("--servers=", list),
                                   "--worker_id=0",
                                   "--num_workers=1",
                                   "--hidden=32",
                                   "--steps=100",
                                   "--log_every_steps=50"};
  absl::StatusOr<std::unique_ptr<Subprocess>> w = StartWorker(args);
  REQUIRE_OK(w.status());
  REQUIRE_OK(
      WaitForLog(w->get(), "waiting for 2 of 2 shards", absl::Seconds(30)));
  absl::StatusOr<ServerProcess> s0 =
      StartPsServer(0, 2, {}, absl::Seconds(30), p0);
  REQUIRE_OK(s0.status());
  absl::StatusOr<ServerProcess> s1 =
      StartPsServer(1, 2, {}, absl::Seconds(30), p1);
  REQUIRE_OK(s1.status());
  absl::StatusOr<int> code = (*w)->Wait(absl::Minutes(2));
  INFO((*w)->LogTail());
  REQUIRE_OK(code.status());
  CHECK(*code == 0);
  CHECK(testing::FinalAccuracy((*w)->ReadLog()) > 0.5);
}

TEST_CASE(
    "every wait says what it waits for, and a signal ends it at once "
    "(exit 143)",
    "[faults][signals][waits]") {
  // Waiting for the tensors worker 0 creates (there is no worker 0).
  absl::StatusOr<ServerProcess> shard = StartPsServer(0, 1);
  REQUIRE_OK(shard.status());
  std::unique_ptr<Subprocess> w1 =
      Worker(shard->address, 1, {"--wait_for_tensors_s=600"});
  REQUIRE_OK(WaitForLog(w1.get(),
                        "waiting for the tensors another worker creates",
                        absl::Seconds(30)));
  CHECK(absl::StrContains(w1->ReadLog(), "'fc0/w' on shard 0"));
  REQUIRE_OK(w1->Signal(SIGTERM));
  absl::StatusOr<int> code = w1->Wait(absl::Seconds(10));
  INFO(w1->LogTail());
  REQUIRE_OK(code.status());
  CHECK(*code == 128 + SIGTERM);

  // Waiting for a shard that is not there.
  absl::StatusOr<std::string> nobody = testing::UnusedLoopbackAddress();
  REQUIRE_OK(nobody.status());
  std::unique_ptr<Subprocess> early =
      Worker(*nobody, 0, {"--wait_for_shards_s=600"}, /*num_workers=*/1);
  REQUIRE_OK(
      WaitForLog(early.get(), "waiting for 1 of 1 shards", absl::Seconds(30)));
  REQUIRE_OK(early->Signal(SIGTERM));
  code = early->Wait(absl::Seconds(10));
  INFO(early->LogTail());
  REQUIRE_OK(code.status());
  CHECK(*code == 128 + SIGTERM);
}

}  // namespace
}  // namespace asyncps
