// The training loop every model runs (worker/training_loop.h), driven with
// a recording model and store: every example of the share is trained once
// per epoch (also after a resume), reads and pushes follow the pipelining
// and in-flight rules, the data position advances in push order, and
// stops, failures and finished shares end as documented.

#include "worker/training_loop.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/logging.h"
#include "worker/partition.h"

namespace asyncps {
namespace {

// One thing the loop did, in order: who (store or model), what, numbers.
struct Event {
  std::string what;
  int64_t a = 0, b = 0, c = 0, d = 0;
};

class Recorder {
 public:
  void Add(std::string what, int64_t a = 0, int64_t b = 0, int64_t c = 0,
           int64_t d = 0) {
    events.push_back({std::move(what), a, b, c, d});
  }
  // Indices of the events named `what`.
  std::vector<size_t> Find(const std::string& what) const {
    std::vector<size_t> at;
    for (size_t i = 0; i < events.size(); ++i) {
      if (events[i].what == what) at.push_back(i);
    }
    return at;
  }
  // The first number of each event named `what`, in order.
  std::vector<int64_t> FirstOf(const std::string& what) const {
    std::vector<int64_t> a;
    for (size_t i : Find(what)) a.push_back(events[i].a);
    return a;
  }
  std::vector<Event> events;
};

// The cluster side: registration answers as configured; records the data
// position and leaving.
class RecordingStore : public ParameterStore {
 public:
  explicit RecordingStore(Recorder* r) : r_(r) {}
  absl::Status Create(const std::vector<TensorSpec>&,
                      const std::vector<TableSpec>&) override {
    return absl::OkStatus();
  }
  absl::Status WaitFor(const std::vector<std::string>&,
                       absl::Duration) override {
    return absl::OkStatus();
  }
  absl::StatusOr<Registration> Register() override {
    r_->Add("register");
    return registration;
  }
  std::unique_ptr<PendingPull> StartPull(int64_t, int64_t,
                                         const PullSet&) override {
    return nullptr;  // the recording model reads nothing
  }
  std::unique_ptr<PendingPush> StartPush(int64_t, const PushSet&,
                                         const ReadSet&) override {
    return nullptr;
  }
  absl::Status Heartbeat(int64_t clock, bool leaving) override {
    if (leaving) r_->Add("leave", clock);
    return absl::OkStatus();
  }
  void ReportTrained(int64_t steps) override { r_->Add("trained", steps); }
  absl::StatusOr<int> LiveWorkers() override { return 0; }

  Registration registration;

 private:
  Recorder* const r_;
};

// The model side: records every call and the examples of every step.
class RecordingModel : public TrainingModel {
 public:
  explicit RecordingModel(Recorder* r) : r_(r) {}

  absl::Status Setup(const TrainingPlan&, int read_sets,
                     int grad_sets) override {
    r_->Add("setup", read_sets, grad_sets);
    return absl::OkStatus();
  }
  absl::Status Begin(const TrainingPlan&) override {
    r_->Add("begin");
    return absl::OkStatus();
  }
  void StartRead(int set, int64_t step, absl::Span<const int64_t>,
                 int64_t clock, int64_t for_clock) override {
    r_->Add("read", set, step, clock, for_clock);
  }
  absl::Status WaitRead(int set) override {
    r_->Add("wait_read", set);
    return absl::OkStatus();
  }
  absl::Status Step(int set, int grads, int64_t j, int64_t round,
                    absl::Span<const int64_t> examples) override {
    r_->Add("step", set, grads, j, round);
    trained.emplace_back(examples.begin(), examples.end());
    if (stop_after_steps > 0 &&
        static_cast<int64_t>(trained.size()) == stop_after_steps) {
      stop.store(true);
    }
    return absl::OkStatus();
  }
  void StartPush(int set, int grads, int64_t clock) override {
    r_->Add("push", set, grads, clock);
  }
  absl::Status WaitPush(int grads) override {
    r_->Add("wait_push", grads);
    if (++pushes_waited == fail_push) {
      return absl::UnavailableError("shard 1 is gone");
    }
    return absl::OkStatus();
  }
  void DropPushes() override { r_->Add("drop"); }
  absl::Status Evaluate(int set, bool final, const LoopPosition& at) override {
    r_->Add(final ? "final_eval" : "eval", set, at.step, at.clock);
    return absl::OkStatus();
  }
  void Progress(const LoopPosition& at) override {
    r_->Add("progress", at.step, at.window_steps, at.window_examples);
  }
  std::string Summary() const override { return "recorded"; }

  std::vector<std::vector<int64_t>> trained;  // examples, per step
  std::atomic<bool> stop{false};
  int64_t stop_after_steps = 0;  // > 0: set `stop` in that step
  int fail_push = 0;             // > 0: that WaitPush fails
  int pushes_waited = 0;

 private:
  Recorder* const r_;
};

struct Fixture {
  Fixture() : store(&rec), model(&rec) {
    o.worker_id = 1;
    o.num_workers = 2;
    o.batch_size = 8;
    o.epochs = 2;
    o.seed = 7;
    o.evaluate = false;
    o.log_every_steps = 4;
    o.logger = NullLogger();
    o.progress = std::tmpfile();
    o.stop = &model.stop;
  }
  ~Fixture() { std::fclose(o.progress); }

  // The shards recorded `trained` steps of this worker id, which reached
  // `clock`: the loop resumes there.
  void Registered(int64_t trained, int64_t clock) {
    store.registration.trained = trained;
    store.registration.resume_clock = clock;
  }

  absl::StatusOr<LoopResult> Run(int push_every = 1) {
    return RunTrainingLoop(o, kExamples, push_every, &store, &model);
  }

  // The examples steps [from, to) of worker 1's share must train, in
  // order: the share's per-epoch shuffles, batch by batch.
  std::vector<std::vector<int64_t>> Expected(int64_t from, int64_t to) const {
    absl::StatusOr<TrainingPlan> plan = PlanTraining(
        kExamples, o.num_workers, o.worker_id, o.batch_size, o.epochs, 0);
    REQUIRE(plan.ok());
    std::vector<std::vector<int64_t>> steps;
    for (int64_t s = from; s < to; ++s) {
      const std::vector<int64_t> order = EpochOrder(
          plan->share, o.seed, o.worker_id, s / plan->steps_per_epoch);
      const size_t at = (s % plan->steps_per_epoch) * o.batch_size;
      const size_t n = std::min<size_t>(o.batch_size, order.size() - at);
      steps.emplace_back(order.begin() + at, order.begin() + at + n);
    }
    return steps;
  }

  // 2 workers x 37 examples: worker 1 has 37 (5 steps, the last of 5), so
  // 10 steps in 2 epochs.
  static constexpr int64_t kExamples = 74;
  Recorder rec;
  RecordingStore store;
  RecordingModel model;
  LoopOptions o;
};

TEST_CASE("every example of the share trains once per epoch, in order",
          "[training_loop]") {
  Fixture f;
  f.o.max_pushes_in_flight = 2;
  absl::StatusOr<LoopResult> r = f.Run();
  REQUIRE(r.ok());
  CHECK(r->total_steps == 10);
  CHECK(r->steps == 10);
  CHECK(r->examples == 74);  // both epochs of the 37-example share
  CHECK(r->first_step == 0);
  CHECK_FALSE(r->stopped);
  CHECK(f.model.trained == f.Expected(0, 10));
  // Two read sets, one gradient set per push in flight plus one.
  REQUIRE(f.rec.events[0].what == "setup");
  CHECK(f.rec.events[0].a == 2);
  CHECK(f.rec.events[0].b == 3);
}

TEST_CASE("reads are pipelined and pushes stay within the in-flight bound",
          "[training_loop]") {
  Fixture f;
  f.o.max_pushes_in_flight = 2;
  REQUIRE(f.Run().ok());
  const std::vector<Event>& ev = f.rec.events;
  // Step k's read: read set k % 2, as clock k - 1 (the clock of the step
  // computing while it is in flight) for clock k; started before step k-1
  // computes.
  const std::vector<size_t> reads = f.rec.Find("read");
  const std::vector<size_t> steps = f.rec.Find("step");
  REQUIRE(reads.size() == 10);
  REQUIRE(steps.size() == 10);
  for (int64_t k = 0; k < 10; ++k) {
    INFO("step " << k);
    CHECK(ev[reads[k]].a == k % 2);
    CHECK(ev[reads[k]].b == k);
    CHECK(ev[reads[k]].c == std::max<int64_t>(k - 1, 0));
    CHECK(ev[reads[k]].d == k);
    CHECK(ev[steps[k]].a == k % 2);  // computes on what its read filled
    if (k > 0) CHECK(reads[k] < steps[k - 1]);
  }
  // At most 2 pushes in flight; a gradient set is written only after its
  // previous push was waited for; pushes carry clocks 0, 1, 2, ...
  std::map<int64_t, bool> busy;
  int in_flight = 0;
  int64_t next_clock = 0;
  for (const Event& e : ev) {
    if (e.what == "step") CHECK_FALSE(busy[e.b]);
    if (e.what == "push") {
      CHECK(e.c == next_clock++);
      busy[e.b] = true;
      CHECK(++in_flight <= 2);
    }
    if (e.what == "wait_push") {
      CHECK(busy[e.a]);
      busy[e.a] = false;
      --in_flight;
    }
  }
  CHECK(in_flight == 0);
  // The data position advances by one step per push, in order, and is
  // complete before the worker leaves.
  const std::vector<size_t> trained = f.rec.Find("trained");
  REQUIRE(trained.size() == 10);
  for (int64_t k = 0; k < 10; ++k) CHECK(ev[trained[k]].a == k + 1);
  const std::vector<size_t> leave = f.rec.Find("leave");
  REQUIRE(leave.size() == 1);
  CHECK(leave[0] > trained.back());
  CHECK(ev[leave[0]].a == 10);
  // Progress every 4 steps, each window's steps and examples.
  const std::vector<size_t> progress = f.rec.Find("progress");
  REQUIRE(progress.size() == 2);
  CHECK(ev[progress[0]].a == 4);
  CHECK(ev[progress[0]].b == 4);
  CHECK(ev[progress[0]].c == 32);
  CHECK(ev[progress[1]].a == 8);
  CHECK(ev[progress[1]].c == 5 + 8 + 8 + 8);  // 5 (epoch 0's last), 8...
}

TEST_CASE("rounds of push_every steps push once each, without pipelining",
          "[training_loop]") {
  Fixture f;
  f.o.pipeline = false;
  absl::StatusOr<LoopResult> r = f.Run(/*push_every=*/3);
  REQUIRE(r.ok());
  CHECK(r->steps == 10);
  CHECK(f.model.trained == f.Expected(0, 10));
  const std::vector<Event>& ev = f.rec.events;
  // Rounds of 3, 3, 3 and 1 steps; one read and one push per round.
  std::vector<std::pair<int64_t, int64_t>> j_round;
  for (size_t i : f.rec.Find("step")) j_round.push_back({ev[i].c, ev[i].d});
  CHECK(j_round == std::vector<std::pair<int64_t, int64_t>>{{0, 3},
                                                            {1, 3},
                                                            {2, 3},
                                                            {0, 3},
                                                            {1, 3},
                                                            {2, 3},
                                                            {0, 3},
                                                            {1, 3},
                                                            {2, 3},
                                                            {0, 1}});
  const std::vector<size_t> reads = f.rec.Find("read");
  const std::vector<size_t> pushes = f.rec.Find("push");
  REQUIRE(reads.size() == 4);
  REQUIRE(pushes.size() == 4);
  for (int64_t k = 0; k < 4; ++k) {
    CHECK(ev[reads[k]].b == 3 * k);  // the round's first step
    CHECK(ev[reads[k]].c == k);      // as the clock of the round...
    CHECK(ev[reads[k]].d == k);      // ...for itself: no read ahead
    CHECK(ev[pushes[k]].c == k);
    if (k > 0) CHECK(reads[k] > pushes[k - 1]);
  }
  CHECK(f.rec.FirstOf("trained") == std::vector<int64_t>{3, 6, 9, 10});
}

TEST_CASE("a restarted worker continues its share at the data position",
          "[training_loop]") {
  Fixture f;
  f.Registered(6, 9);
  absl::StatusOr<LoopResult> r = f.Run();
  REQUIRE(r.ok());
  CHECK(r->first_step == 6);
  CHECK(r->steps == 4);
  CHECK(r->examples == 8 + 8 + 8 + 5);  // steps 6..9
  // Exactly the steps not yet trained: none skipped, none repeated.
  CHECK(f.model.trained == f.Expected(6, 10));
  // Pushed at the clocks it resumed at, each acknowledged in order.
  std::vector<int64_t> clocks;
  for (size_t i : f.rec.Find("push")) clocks.push_back(f.rec.events[i].c);
  CHECK(clocks == std::vector<int64_t>{9, 10, 11, 12});
  CHECK(f.rec.FirstOf("trained") == std::vector<int64_t>{7, 8, 9, 10});
}

TEST_CASE("a share already trained trains nothing and leaves",
          "[training_loop]") {
  Fixture f;
  f.Registered(10, 12);
  f.o.evaluate = true;
  absl::StatusOr<LoopResult> r = f.Run();
  REQUIRE(r.ok());
  CHECK(r->already_trained);
  CHECK(r->steps == 0);
  CHECK(r->total_steps == 10);
  CHECK(f.rec.Find("begin").empty());
  CHECK(f.rec.Find("read").empty());
  CHECK(f.rec.Find("final_eval").empty());
  REQUIRE(f.rec.Find("leave").size() == 1);
  CHECK(f.rec.events[f.rec.Find("leave")[0]].a == 12);
}

TEST_CASE("a stop ends after the current round; pushes finish; no final eval",
          "[training_loop]") {
  Fixture f;
  f.o.evaluate = true;
  f.o.max_pushes_in_flight = 3;
  f.model.stop_after_steps = 4;
  absl::StatusOr<LoopResult> r = f.Run();
  REQUIRE(r.ok());
  CHECK(r->stopped);
  CHECK(r->steps == 4);
  CHECK(f.model.trained == f.Expected(0, 4));
  CHECK(f.rec.Find("push").size() == 4);
  CHECK(f.rec.Find("wait_push").size() == 4);
  CHECK(f.rec.FirstOf("trained") == std::vector<int64_t>{1, 2, 3, 4});
  CHECK(f.rec.Find("final_eval").empty());
  CHECK(f.rec.Find("leave").size() == 1);
}

TEST_CASE("a failed push ends the run with its error, after leaving",
          "[training_loop]") {
  Fixture f;
  f.o.max_pushes_in_flight = 2;
  f.model.fail_push = 2;
  absl::StatusOr<LoopResult> r = f.Run();
  CHECK(absl::IsUnavailable(r.status()));
  CHECK(r.status().message() == "shard 1 is gone");
  // Only the acknowledged step counts as trained.
  CHECK(f.rec.FirstOf("trained") == std::vector<int64_t>{1});
  REQUIRE(f.rec.Find("drop").size() == 1);
  REQUIRE(f.rec.Find("leave").size() == 1);
  CHECK(f.rec.Find("drop")[0] < f.rec.Find("leave")[0]);
}

TEST_CASE("evaluations: once per epoch by default, every N steps, or never",
          "[training_loop]") {
  for (const auto& [every, steps] :
       std::vector<std::pair<int64_t, std::vector<int64_t>>>{
           {0, {5, 10}}, {3, {3, 6, 9}}, {-1, {}}}) {
    Fixture f;
    f.o.evaluate = true;
    f.o.eval_every_steps = every;
    REQUIRE(f.Run().ok());
    std::vector<int64_t> at;
    for (size_t i : f.rec.Find("eval")) at.push_back(f.rec.events[i].b);
    INFO("eval_every_steps " << every);
    CHECK(at == steps);
    // The final evaluation comes after leaving (every push answered), as
    // the clock after the last push; then the worker leaves again.
    const std::vector<size_t> final_eval = f.rec.Find("final_eval");
    REQUIRE(final_eval.size() == 1);
    CHECK(f.rec.events[final_eval[0]].c == 10);
    const std::vector<size_t> leave = f.rec.Find("leave");
    REQUIRE(leave.size() == 2);
    CHECK(leave[0] < final_eval[0]);
    CHECK(final_eval[0] < leave[1]);
  }
}

TEST_CASE("bad loop options are refused before anything runs",
          "[training_loop]") {
  Fixture f;
  f.o.max_pushes_in_flight = 0;
  absl::StatusOr<LoopResult> r = f.Run();
  CHECK(absl::IsInvalidArgument(r.status()));
  CHECK(f.rec.events.empty());
  f.o.max_pushes_in_flight = 1;
  r = f.Run(/*push_every=*/0);
  CHECK(absl::IsInvalidArgument(r.status()));
  f.o.worker_id = 2;  // of 2 workers
  r = f.Run();
  CHECK(absl::IsInvalidArgument(r.status()));
  CHECK(f.rec.events.empty());
}

}  // namespace
}  // namespace asyncps
