// Read-side staleness against real ps_server processes: a pull at clock c
// is answered under SSP(s) once every live worker has clock >= c - s, under
// BSP once every live worker finished clock c - 1, under ASP at once; a
// silent worker stops counting after its lease and counts again when it
// speaks; a pull waits at most --pull_wait_timeout_ms; a rejected pull
// moves no clock.
//
// Every simulated worker is its own PsClient (distinct worker_id). A pull
// that should block runs on a BackgroundCall; the test sees the shard hold it
// (Status: the worker's waiting_pulls), and after each call that changes a
// clock reads again whether it still waits (a shard settles that before it
// answers the call), then releases it and waits for it. Deadlines only bound
// hangs; nothing is inferred from time passing.

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/ps_client.h"
#include "common/net.h"
#include "proto/asyncps.grpc.pb.h"
#include "proto/asyncps.pb.h"
#include "spdlog/sinks/ringbuffer_sink.h"
#include "spdlog/spdlog.h"
#include "tests/staleness/harness.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace staleness {
namespace {

// Deadline for a released pull to come back (bounds a hang only).
constexpr absl::Duration kRelease = absl::Seconds(60);

// `pull` (of `worker_id`) is blocked: the shard holds it as waiting, and it
// has not returned.
void CheckStillWaiting(Shard& shard, int32_t worker_id,
                       const BackgroundCall& pull) {
  INFO("worker " << worker_id << "'s pull");
  CHECK(shard.WaitingPulls(worker_id) == 1);
  CHECK_FALSE(pull.done());
}

std::unique_ptr<PsClient> Worker(const Shard& shard, int32_t id,
                                 uint64_t incarnation, const TensorSpec& spec) {
  absl::StatusOr<std::unique_ptr<PsClient>> client =
      ConnectWorker(shard.address(), id, incarnation);
  REQUIRE_OK(client.status());
  REQUIRE_OK((*client)->CreateTensors({spec}));  // idempotent
  return *std::move(client);
}

using Buffer = std::vector<float>;

absl::Status PullInto(PsClient* client, int64_t clock, Buffer* out) {
  return client->Pull(clock, {{"w", out->data()}});
}

absl::Status PushGrad(PsClient* client, int64_t clock, const Buffer& grad) {
  absl::StatusOr<PushSummary> summary =
      client->Push(clock, {{"w", grad.data()}});
  if (!summary.ok()) return summary.status();
  if (summary->applied != 1) {
    return absl::InternalError(
        absl::StrCat("push at clock ", clock, ": ", summary->applied,
                     " applied, ", summary->refused_stale, " refused"));
  }
  return absl::OkStatus();
}

TEST_CASE("SSP slack 2: a pull 3 clocks ahead waits for the straggler's push",
          "[ssp]") {
  Shard shard = StartOneShard(
      {"--consistency=ssp", "--ssp_slack=2", "--pull_wait_timeout_ms=20000"});
  // One slice, init 0, lr 1: the value is minus the sum of the gradients.
  const TensorSpec spec = ConstantSgdSpec("w", 4, 0.0f, 1.0f, 4);
  std::unique_ptr<PsClient> a = Worker(shard, 0, 11, spec);
  std::unique_ptr<PsClient> b = Worker(shard, 1, 12, spec);

  Buffer a_values(4), b_values(4);
  // B registers at clock 0 and reads version 0; then it is held back.
  REQUIRE_OK(PullInto(b.get(), 0, &b_values));

  const Buffer ones(4, 1.0f);
  for (int64_t c = 0; c < 3; ++c) {
    // Clocks 0..2 are within 2 of B's clock 0: answered at once.
    REQUIRE_OK(PullInto(a.get(), c, &a_values));
    CHECK(a->PulledVersions("w") == std::vector<uint64_t>{uint64_t(c)});
    REQUIRE_OK(PushGrad(a.get(), c, ones));
  }
  StatusResponse status = shard.Status();
  CHECK(status.counters().pull_waits() == 0);
  REQUIRE(FindWorker(status, 0) != nullptr);
  REQUIRE(FindWorker(status, 1) != nullptr);
  CHECK(FindWorker(status, 0)->clock() == 3);
  CHECK(FindWorker(status, 1)->clock() == 0);
  CHECK(FindWorker(status, 1)->lag() == 3);

  // Clock 3 needs every live worker at >= 1: B (at 0) holds it.
  BackgroundCall pull([&] { return PullInto(a.get(), 3, &a_values); });
  shard.AwaitWaitingPulls(0, 1);
  CHECK_FALSE(pull.done());
  CHECK(shard.Status().counters().pull_waits() == 1);

  // B finishes step 0 with a gradient computed from version 0: clock 1.
  const Buffer tens(4, 10.0f);
  const absl::Time b_pushed = absl::Now();
  absl::StatusOr<PushSummary> b_push = b->Push(0, {{"w", tens.data()}});
  REQUIRE_OK(b_push.status());
  CHECK(b_push->applied == 1);
  CHECK(b_push->max_staleness == 3);

  REQUIRE(pull.WaitDone(kRelease));
  REQUIRE_OK(pull.status());
  CHECK(pull.finished() >= b_pushed);
  // A's three pushes of 1 and B's push of 10.
  for (float v : a_values) CHECK(v == -13.0f);
  CHECK(a->PulledVersions("w") == std::vector<uint64_t>{4});
  CHECK(shard.Status().counters().pull_wait_timeouts() == 0);
  a.reset();
  b.reset();
  shard.Stop();
}

TEST_CASE("BSP: three workers move in lock-step", "[bsp]") {
  constexpr int kWorkers = 3;
  constexpr int kSteps = 5;
  // The straggler of each step sleeps this long before pushing.
  constexpr absl::Duration kDelay = absl::Milliseconds(150);
  Shard shard =
      StartOneShard({"--consistency=bsp", "--pull_wait_timeout_ms=20000"});
  const TensorSpec spec = ConstantSgdSpec("w", 2, 0.0f, 1.0f, 2);
  std::vector<std::unique_ptr<PsClient>> workers;
  for (int w = 0; w < kWorkers; ++w) {
    workers.push_back(Worker(shard, w, 100 + w, spec));
  }
  // Everyone is registered at clock 0 before anyone steps.
  for (auto& w : workers) REQUIRE_OK(w->Heartbeat(0));

  // One global sequence orders the events of all workers.
  std::atomic<int64_t> sequence{0};
  struct Step {
    int64_t pull_returned = -1;  // sequence number
    int64_t push_started = -1;   // sequence number
    uint64_t version = 0;        // as pulled
    float value = 1.0f;          // element 0 as pulled
  };
  std::vector<std::vector<Step>> steps(kWorkers, std::vector<Step>(kSteps));
  std::vector<std::unique_ptr<BackgroundCall>> runs;
  for (int w = 0; w < kWorkers; ++w) {
    runs.push_back(std::make_unique<BackgroundCall>([&, w]() -> absl::Status {
      PsClient* client = workers[w].get();
      Buffer values(2);
      const Buffer ones(2, 1.0f);
      for (int c = 0; c < kSteps; ++c) {
        absl::Status s = PullInto(client, c, &values);
        if (!s.ok()) return s;
        Step& step = steps[w][c];
        step.pull_returned = sequence++;
        step.version = client->PulledVersions("w").at(0);
        step.value = values[0];
        if (c % kWorkers == w) absl::SleepFor(kDelay);
        step.push_started = sequence++;
        s = PushGrad(client, c, ones);
        if (!s.ok()) return s;
      }
      return absl::OkStatus();
    }));
  }
  for (int w = 0; w < kWorkers; ++w) {
    INFO("worker " << w);
    REQUIRE(runs[w]->WaitDone(absl::Seconds(60)));
    REQUIRE_OK(runs[w]->status());
  }

  for (int c = 0; c + 1 < kSteps; ++c) {
    for (int x = 0; x < kWorkers; ++x) {
      for (int y = 0; y < kWorkers; ++y) {
        INFO("worker " << x << "'s pull at clock " << c + 1 << " vs worker "
                       << y << "'s push at clock " << c);
        CHECK(steps[x][c + 1].pull_returned > steps[y][c].push_started);
      }
    }
  }
  // What a pull at clock c sees: every push of clocks < c, none of the
  // puller's own at c, at most the other two at c.
  for (int w = 0; w < kWorkers; ++w) {
    for (int c = 0; c < kSteps; ++c) {
      INFO("worker " << w << " clock " << c);
      CHECK(steps[w][c].version >= uint64_t(kWorkers * c));
      CHECK(steps[w][c].version <= uint64_t(kWorkers * c + kWorkers - 1));
      CHECK(steps[w][c].value == -float(steps[w][c].version));
    }
  }
  const StatusResponse status = shard.Status();
  CHECK(status.counters().pull_waits() > 0);
  CHECK(status.counters().pull_wait_timeouts() == 0);
  CHECK(status.counters().updates_applied() == uint64_t(kWorkers * kSteps));
  for (int w = 0; w < kWorkers; ++w) {
    REQUIRE(FindWorker(status, w) != nullptr);
    CHECK(FindWorker(status, w)->clock() == kSteps);
  }
  runs.clear();
  workers.clear();
  shard.Stop();
}

TEST_CASE("a pull held back says what it waits for, and a stop ends it at once",
          "[bsp][waits]") {
  Shard shard =
      StartOneShard({"--consistency=bsp", "--pull_wait_timeout_ms=60000"});
  const TensorSpec spec = ConstantSgdSpec("w", 2, 0.0f, 1.0f, 2);
  // Worker 1 stays live at clock 0, so a pull for clock 1 waits.
  std::unique_ptr<PsClient> idle = Worker(shard, 1, 11, spec);
  REQUIRE_OK(idle->Heartbeat(0));
  KeepAlive alive(shard.address(), 1, 11, 0);

  // The client's log lines (the sink locks; the test reads through it).
  auto log = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(1000);
  auto logged = [&log] { return absl::StrJoin(log->last_formatted(), ""); };
  std::atomic<bool> stop{false};
  PsClientOptions o;
  o.servers = {shard.address()};
  o.worker_id = 2;
  o.retry.report_every = absl::Milliseconds(100);
  o.stop = &stop;
  o.logger = std::make_shared<spdlog::logger>("w2", log);
  absl::StatusOr<std::unique_ptr<PsClient>> waiting = PsClient::Connect(o);
  REQUIRE_OK(waiting.status());
  REQUIRE_OK((*waiting)->CreateTensors({spec}));
  Buffer values(2);
  BackgroundCall pull([&] { return PullInto(waiting->get(), 1, &values); });
  shard.AwaitWaitingPulls(2, 1);
  REQUIRE_OK(testing::WaitFor(
      [&] { return absl::StrContains(logged(), "no answer yet after"); },
      absl::Seconds(20), "the waiting pull's log line"));
  CHECK(absl::StrContains(logged(), "Pull on shard 0"));
  CHECK_FALSE(pull.done());
  stop = true;
  REQUIRE(pull.WaitDone(absl::Seconds(10)));
  INFO(pull.status().ToString());
  CHECK(absl::IsCancelled(pull.status()));
  CHECK(absl::StrContains(pull.status().message(), "stopped"));
  // The shard dropped the wait (the stream was cancelled).
  shard.AwaitWaitingPulls(2, 0);
  alive.Stop();
  waiting->reset();
  idle.reset();
  shard.Stop();
}

TEST_CASE("ASP: a fast worker never waits for an idle one", "[asp]") {
  constexpr int kSteps = 20;
  Shard shard = StartOneShard({"--consistency=asp"});
  const TensorSpec spec = ConstantSgdSpec("w", 2, 0.0f, 1.0f, 2);
  std::unique_ptr<PsClient> idle = Worker(shard, 1, 22, spec);
  REQUIRE_OK(idle->Heartbeat(0));  // registered, then silent at clock 0
  std::unique_ptr<PsClient> fast = Worker(shard, 0, 21, spec);

  Buffer values(2);
  BackgroundCall run([&]() -> absl::Status {
    const Buffer ones(2, 1.0f);
    for (int c = 0; c < kSteps; ++c) {
      absl::Status s = PullInto(fast.get(), c, &values);
      if (s.ok()) s = PushGrad(fast.get(), c, ones);
      if (!s.ok()) return s;
    }
    return PullInto(fast.get(), kSteps, &values);
  });
  REQUIRE(run.WaitDone(kRelease));
  REQUIRE_OK(run.status());
  for (float v : values) CHECK(v == -float(kSteps));

  const StatusResponse status = shard.Status();
  CHECK(status.policy().consistency() == ASP);
  CHECK(status.counters().pull_waits() == 0);
  CHECK(status.counters().pulls() == kSteps + 1);
  REQUIRE(FindWorker(status, 0) != nullptr);
  REQUIRE(FindWorker(status, 1) != nullptr);
  CHECK(FindWorker(status, 0)->clock() == kSteps);
  CHECK(FindWorker(status, 1)->clock() == 0);
  CHECK(FindWorker(status, 1)->live());
  CHECK(FindWorker(status, 1)->lag() == kSteps);
  idle.reset();
  fast.reset();
  shard.Stop();
}

TEST_CASE(
    "a silent worker is evicted after its lease and counts again when "
    "it speaks",
    "[lease][ssp]") {
  Shard shard =
      StartOneShard({"--consistency=ssp", "--ssp_slack=0",
                     "--worker_lease_ms=1000", "--pull_wait_timeout_ms=20000"});
  constexpr uint64_t kIncarnationA = 31, kIncarnationB = 32;
  const TensorSpec spec = ConstantSgdSpec("w", 2, 0.0f, 1.0f, 2);
  std::unique_ptr<PsClient> a = Worker(shard, 0, kIncarnationA, spec);
  std::unique_ptr<PsClient> b = Worker(shard, 1, kIncarnationB, spec);
  Buffer a_values(2), b_values(2);
  const Buffer ones(2, 1.0f);

  // B registers at clock 0; heartbeats keep its lease until A's pull waits
  // for it (however slow the machine), then B goes silent.
  REQUIRE_OK(PullInto(b.get(), 0, &b_values));
  KeepAlive b_beats(shard.address(), 1, kIncarnationB, 0);
  // A finishes step 0.
  REQUIRE_OK(PullInto(a.get(), 0, &a_values));
  REQUIRE_OK(PushGrad(a.get(), 0, ones));
  {
    // A stays live while its pull waits, so that B is the only one whose
    // lease runs out.
    KeepAlive a_alive(shard.address(), 0, kIncarnationA, 1);
    BackgroundCall pull([&] { return PullInto(a.get(), 1, &a_values); });
    shard.AwaitWaitingPulls(0, 1);
    CHECK_FALSE(pull.done());
    b_beats.Stop();
    CHECK(b_beats.failures() == 0);
    const absl::Time b_last_beat = b_beats.last_beat_started();
    // No one speaks for B: the lease releases A, not before it runs out.
    REQUIRE(pull.WaitDone(kRelease));
    REQUIRE_OK(pull.status());
    const absl::Duration released_after = pull.finished() - b_last_beat;
    INFO("released " << absl::FormatDuration(released_after)
                     << " after B's last heartbeat");
    CHECK(released_after >= absl::Milliseconds(1000));
    for (float v : a_values) CHECK(v == -1.0f);

    const StatusResponse status = shard.Status();
    CHECK(status.counters().evictions() == 1);
    REQUIRE(FindWorker(status, 0) != nullptr);
    REQUIRE(FindWorker(status, 1) != nullptr);
    CHECK(FindWorker(status, 0)->live());
    CHECK_FALSE(FindWorker(status, 1)->live());
    CHECK_FALSE(FindWorker(status, 1)->left());
    CHECK(FindWorker(status, 1)->clock() == 0);
    CHECK(a_alive.failures() == 0);
  }

  // B speaks again: it is live and holds A back once more.
  REQUIRE_OK(b->Heartbeat(0));
  {
    KeepAlive a_alive(shard.address(), 0, kIncarnationA, 1);
    KeepAlive b_alive(shard.address(), 1, kIncarnationB, 0);
    {
      const StatusResponse status = shard.Status();
      REQUIRE(FindWorker(status, 1) != nullptr);
      CHECK(FindWorker(status, 1)->live());
      CHECK(status.counters().evictions() == 1);
    }
    REQUIRE_OK(PushGrad(a.get(), 1, ones));  // A: clock 2
    BackgroundCall pull([&] { return PullInto(a.get(), 2, &a_values); });
    shard.AwaitWaitingPulls(0, 1);
    CHECK_FALSE(pull.done());
    // One step of B (clock 1) is not enough for a pull at clock 2 ...
    REQUIRE_OK(PullInto(b.get(), 0, &b_values));
    REQUIRE_OK(PushGrad(b.get(), 0, ones));
    CheckStillWaiting(shard, 0, pull);
    // ... two are.
    REQUIRE_OK(PullInto(b.get(), 1, &b_values));
    REQUIRE_OK(PushGrad(b.get(), 1, ones));
    REQUIRE(pull.WaitDone(kRelease));
    REQUIRE_OK(pull.status());
    for (float v : a_values) CHECK(v == -4.0f);

    const StatusResponse status = shard.Status();
    CHECK(status.counters().evictions() == 1);
    CHECK(status.counters().pull_wait_timeouts() == 0);
    REQUIRE(FindWorker(status, 1) != nullptr);
    CHECK(FindWorker(status, 1)->live());
    CHECK(FindWorker(status, 1)->clock() == 2);
    CHECK(a_alive.failures() == 0);
    CHECK(b_alive.failures() == 0);
  }
  a.reset();
  b.reset();
  shard.Stop();
}

TEST_CASE(
    "a pull that waits past --pull_wait_timeout_ms fails with "
    "DEADLINE_EXCEEDED naming the workers it waited for",
    "[ssp][timeout]") {
  Shard shard = StartOneShard(
      {"--consistency=ssp", "--ssp_slack=0", "--pull_wait_timeout_ms=500"});
  const TensorSpec spec = ConstantSgdSpec("w", 2, 0.0f, 1.0f, 2);
  std::unique_ptr<PsClient> b = Worker(shard, 1, 42, spec);
  // B is held back at clock 0 but keeps its lease (10 s by default) fresh.
  REQUIRE_OK(b->Heartbeat(0));
  auto b_alive = std::make_unique<KeepAlive>(shard.address(), 1, 42, 0);

  // A raw pull: a PsClient would retry DEADLINE_EXCEEDED.
  PullRequest request;
  request.mutable_worker()->set_worker_id(0);
  request.mutable_worker()->set_incarnation(41);
  request.mutable_worker()->set_clock(1);
  request.add_tensors("w");
  grpc::Status s;
  absl::Duration elapsed;
  {
    PullResponse response;
    grpc::ClientContext ctx;  // holds the connection open while it lives
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    const absl::Time start = absl::Now();
    s = shard.stub->Pull(&ctx, request, &response);
    elapsed = absl::Now() - start;
  }
  INFO(s.error_message() << " after " << absl::FormatDuration(elapsed));
  CHECK(s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
  CHECK(absl::StrContains(s.error_message(), "reach clock 1"));
  CHECK(absl::StrContains(s.error_message(), "behind: worker 1 at clock 0"));
  CHECK(elapsed >= absl::Milliseconds(500));

  const StatusResponse status = shard.Status();
  CHECK(status.counters().pull_waits() == 1);
  CHECK(status.counters().pull_wait_timeouts() == 1);
  CHECK(status.counters().evictions() == 0);
  REQUIRE(FindWorker(status, 1) != nullptr);
  CHECK(FindWorker(status, 1)->live());
  CHECK(b_alive->failures() == 0);
  b_alive.reset();
  b.reset();
  shard.Stop();
}

TEST_CASE(
    "a rejected pull does not move the worker's clock, so it releases "
    "no one",
    "[ssp][bad_input]") {
  Shard shard = StartOneShard(
      {"--consistency=ssp", "--ssp_slack=0", "--pull_wait_timeout_ms=20000"});
  const TensorSpec spec = ConstantSgdSpec("w", 2, 0.0f, 1.0f, 2);
  std::unique_ptr<PsClient> a = Worker(shard, 0, 51, spec);
  std::unique_ptr<PsClient> b = Worker(shard, 1, 52, spec);
  Buffer a_values(2), b_values(2);
  const Buffer ones(2, 1.0f);
  REQUIRE_OK(PullInto(b.get(), 0, &b_values));
  REQUIRE_OK(PullInto(a.get(), 0, &a_values));
  REQUIRE_OK(PushGrad(a.get(), 0, ones));
  BackgroundCall pull([&] { return PullInto(a.get(), 1, &a_values); });
  shard.AwaitWaitingPulls(0, 1);

  // B at clock 1 asks for a tensor that does not exist: NOT_FOUND, and B
  // stays at clock 0.
  {
    PullRequest request;
    request.mutable_worker()->set_worker_id(1);
    request.mutable_worker()->set_incarnation(52);
    request.mutable_worker()->set_clock(1);
    request.add_tensors("nope");
    PullResponse response;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    const grpc::Status s = shard.stub->Pull(&ctx, request, &response);
    INFO(s.error_message());
    CHECK(s.error_code() == grpc::StatusCode::NOT_FOUND);
  }
  const StatusResponse status = shard.Status();
  CHECK(status.counters().rejected_bad_input() == 1);
  REQUIRE(FindWorker(status, 1) != nullptr);
  CHECK(FindWorker(status, 1)->clock() == 0);
  // The refused call moved no clock, so it released no one.
  CheckStillWaiting(shard, 0, pull);

  // B's real step releases A.
  REQUIRE_OK(PushGrad(b.get(), 0, ones));
  REQUIRE(pull.WaitDone(kRelease));
  REQUIRE_OK(pull.status());
  for (float v : a_values) CHECK(v == -2.0f);
  a.reset();
  b.reset();
  shard.Stop();
}

}  // namespace
}  // namespace staleness
}  // namespace asyncps
