// Worker restarts against real shards: a ps_worker killed with SIGKILL and
// started again with the same --worker_id, ten times in a row, is accepted
// every time and trains exactly the rest of its share (no step skipped,
// repeats bounded by the pushes in flight at each kill); the replaced
// process's calls are refused and change nothing (fencing); under SSP a
// restarted worker neither waits for nor holds back its peers, and its data
// position stays apart from the clock it joins at.

#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <catch2/catch.hpp>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/net.h"
#include "common/payload.h"
#include "proto/asyncps.grpc.pb.h"
#include "tests/faults/harness.h"
#include "tests/testing/require_ok.h"

namespace asyncps {
namespace {

using testing::FindWorker;
using testing::ServerList;
using testing::ServerProcess;
using testing::ShardStatus;
using testing::StartPsCluster;
using testing::StartWorker;
using testing::Subprocess;
using testing::WaitForLog;

// The step on the "resuming at step N" line, or -1.
int64_t ResumedAt(const std::string& log) {
  std::smatch m;
  static const std::regex re("resuming at step ([0-9]+)");
  return std::regex_search(log, m, re) ? std::stoll(m[1]) : -1;
}

// Steps worker 1 may repeat per kill: the pushes it had in flight
// (--max_pushes_in_flight=2) and the one acknowledged after it last told
// the shards its data position.
constexpr int64_t kRepeatsPerKill = 3;

// Every step of worker `id`'s share reached every shard, none skipped:
// with a push per step, each shard applied `total` pushes of the role plus
// at most kRepeatsPerKill per kill, and records the whole share as trained.
void CheckShareCovered(const std::vector<ServerProcess>& cluster, int id,
                       int64_t total, int kills) {
  for (const ServerProcess& shard : cluster) {
    absl::StatusOr<StatusResponse> st = ShardStatus(shard.address);
    REQUIRE_OK(st.status());
    const WorkerStatus* w = FindWorker(*st, id);
    REQUIRE(w != nullptr);
    INFO("worker " << id << " on " << shard.address << ": " << w->pushes()
                   << " pushes applied, " << total << " steps in its share");
    CHECK(w->trained() == total);
    CHECK(static_cast<int64_t>(w->pushes()) >= total);
    CHECK(static_cast<int64_t>(w->pushes()) <= total + kRepeatsPerKill * kills);
  }
}

TEST_CASE(
    "a worker killed and restarted 10 times is accepted every time and "
    "continues where it was",
    "[faults][restart]") {
  absl::StatusOr<std::vector<ServerProcess>> cluster = StartPsCluster(2);
  REQUIRE_OK(cluster.status());
  const std::vector<std::string> common = {
      absl::StrCat("--servers=", ServerList(*cluster)), "--num_workers=2",
      "--hidden=32", "--epochs=2", "--log_every_steps=25"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = common;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  absl::StatusOr<std::unique_ptr<Subprocess>> w0 =
      StartWorker(with({"--worker_id=0"}));
  REQUIRE_OK(w0.status());

  int64_t last_resume = 0;
  constexpr int kRestarts = 10;
  for (int restart = 0; restart <= kRestarts; ++restart) {
    absl::StatusOr<std::unique_ptr<Subprocess>> w1 =
        StartWorker(with({"--worker_id=1"}));
    REQUIRE_OK(w1.status());
    INFO("process " << restart << " of worker 1");
    if (restart == kRestarts) {
      // The last one runs to the end.
      absl::StatusOr<int> code = (*w1)->Wait(absl::Minutes(3));
      INFO((*w1)->LogTail());
      REQUIRE_OK(code.status());
      REQUIRE(*code == 0);
      if (restart > 0) CHECK(ResumedAt((*w1)->ReadLog()) >= last_resume);
      break;
    }
    // Training, past its first progress line (25 steps or more after it
    // resumed), then killed mid-step.
    REQUIRE_OK(WaitForLog(w1->get(), "train_acc", absl::Seconds(60)));
    const std::string log = (*w1)->ReadLog();
    CHECK_FALSE(absl::StrContains(log, "FAILED_PRECONDITION"));
    if (restart > 0) {
      const int64_t resumed = ResumedAt(log);
      INFO(log);
      CHECK(resumed > 0);
      CHECK(resumed >= last_resume);
      last_resume = resumed;
    }
    REQUIRE_OK((*w1)->Signal(SIGKILL));
    REQUIRE_OK((*w1)->Wait(absl::Seconds(10)).status());
  }

  absl::StatusOr<int> code0 = (*w0)->Wait(absl::Minutes(3));
  INFO((*w0)->LogTail());
  REQUIRE_OK(code0.status());
  CHECK(*code0 == 0);
  const double acc = testing::FinalAccuracy((*w0)->ReadLog());
  CHECK(acc >= 0.75);

  for (const ServerProcess& shard : *cluster) {
    absl::StatusOr<StatusResponse> st = ShardStatus(shard.address);
    REQUIRE_OK(st.status());
    const WorkerStatus* w1 = FindWorker(*st, 1);
    REQUIRE(w1 != nullptr);
    CHECK(w1->restarts() == kRestarts);
    CHECK(w1->left());
    CHECK(FindWorker(*st, 0)->restarts() == 0);
    CHECK(st->counters().worker_restarts() == kRestarts);
    CHECK(st->counters().rejected_bad_input() == 0);
  }
  // 30000 examples of 60000, batches of 64, 2 epochs.
  CheckShareCovered(*cluster, 1, 2 * ((30000 + 63) / 64), kRestarts);
}

std::unique_ptr<grpc::ClientContext> Context() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::seconds(10));
  return ctx;
}

WorkerRef Ref(uint64_t incarnation, int64_t clock) {
  WorkerRef r;
  r.set_worker_id(5);
  r.set_incarnation(incarnation);
  r.set_clock(clock);
  return r;
}

TEST_CASE("calls of a replaced incarnation are refused and change nothing",
          "[faults][restart][fencing]") {
  absl::StatusOr<ServerProcess> shard = testing::StartPsServer(0, 1);
  REQUIRE_OK(shard.status());
  auto stub = ParameterServer::NewStub(MakeChannel(shard->address));
  CreateTensorRequest create;
  TensorSpec* spec = create.add_tensors();
  spec->set_name("w");
  spec->add_shape(4);
  spec->set_init(INIT_CONSTANT);
  spec->set_init_value(1.0f);
  spec->mutable_optimizer()->set_learning_rate(1.0f);
  CreateTensorResponse created;
  REQUIRE(stub->CreateTensor(Context().get(), create, &created).ok());

  auto push = [&](uint64_t incarnation, uint64_t seq, PushResponse* out) {
    PushRequest req;
    *req.mutable_worker() = Ref(incarnation, 0);
    req.set_seq(seq);
    SliceGradient* g = req.add_grads();
    g->set_tensor("w");
    g->set_slice(0);
    const std::vector<float> grad(4, 0.5f);
    EncodeFloats(grad.data(), grad.size(), g->mutable_grad());
    return stub->Push(Context().get(), req, out);
  };
  auto read = [&](uint64_t* version) {
    PullRequest req;
    *req.mutable_worker() = Ref(999, 0);
    req.mutable_worker()->set_worker_id(6);
    req.add_tensors("w");
    PullResponse resp;
    REQUIRE(stub->Pull(Context().get(), req, &resp).ok());
    std::vector<float> v(4);
    DecodeFloats(resp.slices(0).values(), v.data(), v.size());
    *version = resp.slices(0).version();
    return v;
  };

  // The old process (incarnation 2: bigger than its successor's; numbers
  // carry no order) pushes once.
  PushResponse r;
  REQUIRE(push(2, 1, &r).ok());
  // A new process of worker 5 registers.
  HeartbeatRequest hb;
  *hb.mutable_worker() = Ref(1, 0);
  HeartbeatResponse hr;
  REQUIRE(stub->Heartbeat(Context().get(), hb, &hr).ok());
  CHECK(hr.resume_clock() == 1);
  CHECK(hr.previous_clock() == 1);

  // The zombie's next push, a retry of its first, and a heartbeat: refused.
  const grpc::Status zombie = push(2, 2, &r);
  CHECK(zombie.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(absl::StrContains(zombie.error_message(), "was replaced"));
  CHECK(push(2, 1, &r).error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  *hb.mutable_worker() = Ref(2, 7);
  CHECK(stub->Heartbeat(Context().get(), hb, &hr).error_code() ==
        grpc::StatusCode::FAILED_PRECONDITION);

  uint64_t version = 0;
  CHECK(read(&version) == std::vector<float>(4, 0.5f));
  CHECK(version == 1);
  absl::StatusOr<StatusResponse> st = ShardStatus(shard->address);
  REQUIRE_OK(st.status());
  CHECK(st->counters().fenced_calls() == 3);
  CHECK(st->counters().updates_applied() == 1);
  CHECK(st->counters().rejected_bad_input() == 0);
  const WorkerStatus* w5 = FindWorker(*st, 5);
  REQUIRE(w5 != nullptr);
  CHECK(w5->incarnation() == 1);
  CHECK(w5->clock() == 1);  // the zombie's clock 7 was not taken

  // The new process pushes normally.
  REQUIRE(push(1, 1, &r).ok());
  CHECK_FALSE(r.duplicate());
  CHECK(read(&version) == std::vector<float>(4, 0.0f));
}

TEST_CASE(
    "under SSP a restarted worker resumes at its peers' clock, so "
    "nobody waits for it",
    "[faults][restart][ssp]") {
  absl::StatusOr<std::vector<ServerProcess>> cluster = StartPsCluster(
      1, {"--consistency=ssp", "--ssp_slack=2", "--worker_lease_ms=2000",
          "--pull_wait_timeout_ms=60000"});
  REQUIRE_OK(cluster.status());
  const std::string servers = ServerList(*cluster);
  auto worker = [&](int id, std::vector<std::string> extra) {
    std::vector<std::string> args = {absl::StrCat("--servers=", servers),
                                     absl::StrCat("--worker_id=", id),
                                     "--num_workers=2",
                                     "--hidden=32",
                                     "--log_every_steps=50",
                                     "--evaluate=false"};
    args.insert(args.end(), extra.begin(), extra.end());
    absl::StatusOr<std::unique_ptr<Subprocess>> p = StartWorker(args);
    REQUIRE_OK(p.status());
    return *std::move(p);
  };
  // Worker 0 runs until it is stopped, so it is certainly live (and ahead)
  // when the restarted worker registers, however fast the machine.
  std::unique_ptr<Subprocess> w0 = worker(0, {"--steps=1000000"});
  std::unique_ptr<Subprocess> w1 = worker(1, {"--steps=600"});
  REQUIRE_OK(WaitForLog(w1.get(), "step 100/", absl::Seconds(60)));
  REQUIRE_OK(w1->Signal(SIGKILL));
  REQUIRE_OK(w1->Wait(absl::Seconds(10)).status());
  // Worker 0 is held back by the dead one only until its lease expires.
  REQUIRE_OK(WaitForLog(w0.get(), "step 400/", absl::Seconds(60)));
  // The second process joins at worker 0's clock, far ahead of the steps
  // worker 1 trained: its clock runs ahead of its data position.
  std::unique_ptr<Subprocess> w1b = worker(1, {"--steps=600"});
  REQUIRE_OK(WaitForLog(w1b.get(), "step 200/", absl::Seconds(60)));
  const std::string log_b = w1b->ReadLog();
  REQUIRE_OK(w1b->Signal(SIGKILL));
  REQUIRE_OK(w1b->Wait(absl::Seconds(10)).status());
  const int64_t resumed_b = ResumedAt(log_b);
  INFO(log_b);
  CHECK(resumed_b >= 100 - kRepeatsPerKill);  // pushes in flight at the kill
  std::smatch m;
  static const std::regex re("at clock ([0-9]+)");
  REQUIRE(std::regex_search(log_b, m, re));
  const int64_t joined_clock = std::stoll(m[1]);
  CHECK(joined_clock >= 400);
  // The third process continues where the second one's acknowledged steps
  // end, not at the second one's clock (which would skip 200+ steps).
  std::unique_ptr<Subprocess> again = worker(1, {"--steps=600"});
  absl::StatusOr<int> code = again->Wait(absl::Minutes(2));
  INFO(again->LogTail());
  REQUIRE_OK(code.status());
  CHECK(*code == 0);
  const int64_t resumed = ResumedAt(again->ReadLog());
  CHECK(resumed >= 200 - kRepeatsPerKill);
  CHECK(resumed < joined_clock);
  REQUIRE(w0->Running());
  REQUIRE_OK(w0->Signal(SIGTERM));
  absl::StatusOr<int> code0 = w0->Wait(absl::Minutes(2));
  INFO(w0->LogTail());
  REQUIRE_OK(code0.status());
  CHECK(*code0 == 128 + SIGTERM);  // stopped early: its share not trained
  absl::StatusOr<StatusResponse> st = ShardStatus((*cluster)[0].address);
  REQUIRE_OK(st.status());
  // The restarted processes joined at the slowest live clock (worker 0's,
  // far ahead of where their predecessors died), so no pull ever waited
  // out its timeout, and only the dead processes were evicted.
  CHECK(st->counters().pull_wait_timeouts() == 0);
  CHECK(st->counters().evictions() <= 2);
  CheckShareCovered(*cluster, 1, 600, /*kills=*/2);
}

}  // namespace
}  // namespace asyncps
