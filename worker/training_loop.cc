#include "worker/training_loop.h"

#include <algorithm>
#include <deque>
#include <vector>

#include "absl/strings/str_format.h"

namespace asyncps {
namespace {

// "3m07s", "1h02m", "42s"; "?" for a negative or huge count of seconds.
std::string FormatEta(double seconds) {
  if (!(seconds >= 0) || seconds > 1e7) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, s / 60 % 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%ds", s);
}

class Loop {
 public:
  Loop(const LoopOptions& o, int64_t num_examples, int push_every,
       ParameterStore* store, TrainingModel* model)
      : o_(o),
        num_examples_(num_examples),
        push_every_(push_every),
        store_(store),
        model_(model) {}

  absl::StatusOr<LoopResult> Go() {
    absl::Status s = Setup();
    if (!s.ok()) return s;
    if (result_.already_trained) {
      // Nothing to push; the shards stop counting this process.
      s = store_->Heartbeat(clock_, /*leaving=*/true);
      if (!s.ok()) return s;
      return result_;
    }
    s = model_->Begin(plan_);
    if (!s.ok()) return Abort(s);
    start_ = window_start_ = o_.clock->Now();
    s = Rounds();
    // Every push this worker made is answered before it leaves, which
    // reports the final data position.
    if (s.ok()) s = WaitPushes(0);
    if (!s.ok()) return Abort(s);
    result_.wall_s = absl::ToDoubleSeconds(o_.clock->Now() - start_);
    result_.examples_per_s = result_.examples / std::max(result_.wall_s, 1e-9);
    s = store_->Heartbeat(clock_, /*leaving=*/true);
    if (!s.ok()) return s;
    std::fprintf(o_.progress,
                 "%s worker %d %s: steps %ld..%ld (%ld examples) in %.1f s, "
                 "%.0f examples/s, %s\n",
                 Timestamp().c_str(), o_.worker_id,
                 result_.stopped ? "stopped early" : "done",
                 static_cast<long>(result_.first_step),
                 static_cast<long>(steps_done_),
                 static_cast<long>(result_.examples), result_.wall_s,
                 result_.examples_per_s, model_->Summary().c_str());
    std::fflush(o_.progress);
    if (o_.evaluate && !result_.stopped) {
      // The final model is the one after every worker's last push.
      s = WaitForOtherWorkers(store_, o_.final_wait, o_.clock, o_.stop,
                              *o_.logger);
      if (s.ok()) s = model_->Evaluate(0, /*final=*/true, Position());
      // The evaluation's reads renewed this worker's lease: leave again.
      if (s.ok()) s = store_->Heartbeat(clock_, /*leaving=*/true);
      if (!s.ok()) return s;
    }
    return result_;
  }

 private:
  absl::Status Setup() {
    if (o_.logger == nullptr || o_.clock == nullptr || o_.progress == nullptr) {
      return absl::InvalidArgumentError(
          "LoopOptions.logger, clock and progress are required");
    }
    if (o_.batch_size < 1 || o_.epochs < 1 || o_.log_every_steps < 1 ||
        o_.max_pushes_in_flight < 1 || push_every_ < 1) {
      return absl::InvalidArgumentError(
          "batch_size, epochs, log_every_steps, max_pushes_in_flight and "
          "push_every must be >= 1");
    }
    absl::StatusOr<TrainingPlan> plan =
        PlanTraining(num_examples_, o_.num_workers, o_.worker_id, o_.batch_size,
                     o_.epochs, o_.max_steps);
    if (!plan.ok()) return plan.status();
    plan_ = *plan;
    result_.total_steps = plan_.total_steps;
    grad_sets_ = o_.max_pushes_in_flight + 1;
    absl::Status s = model_->Setup(plan_, /*read_sets=*/2, grad_sets_);
    if (!s.ok()) return s;
    absl::StatusOr<Registration> reg = store_->Register();
    if (!reg.ok()) return reg.status();
    clock_ = reg->resume_clock;
    // The data position, not the clock, says where the share continues.
    const ShareStart start =
        StartShare(*reg, plan_.total_steps, o_.worker_id, *o_.logger);
    steps_done_ = result_.first_step = start.step;
    result_.already_trained = start.already_trained;
    return absl::OkStatus();
  }

  bool Stopping() const {
    return o_.stop != nullptr && o_.stop->load(std::memory_order_relaxed);
  }

  // The examples of step `step`: its slice of the share's order for its
  // epoch (shuffled per epoch; the last batch of an epoch may be short).
  // Valid until the next call.
  absl::Span<const int64_t> Examples(int64_t step) {
    const int64_t epoch = step / plan_.steps_per_epoch;
    if (epoch != order_epoch_) {
      order_ = EpochOrder(plan_.share, o_.seed, o_.worker_id, epoch);
      order_epoch_ = epoch;
    }
    const size_t at =
        static_cast<size_t>(step % plan_.steps_per_epoch) * o_.batch_size;
    return absl::MakeConstSpan(order_).subspan(at, o_.batch_size);
  }

  void StartRead(int set, int64_t step, int64_t for_clock) {
    model_->StartRead(set, step, Examples(step), clock_, for_clock);
  }

  absl::Status Rounds() {
    const int64_t total = plan_.total_steps;
    const int64_t eval_every = o_.eval_every_steps > 0 ? o_.eval_every_steps
                               : o_.eval_every_steps == 0
                                   ? plan_.steps_per_epoch
                                   : 0;
    int cur = 0;  // the read set of the coming round
    if (steps_done_ < total) StartRead(cur, steps_done_, clock_);
    while (steps_done_ < total) {
      absl::Status s = model_->WaitRead(cur);
      // A stop ends a read that waits (e.g. for slower workers) at once.
      if (!s.ok() && !(Stopping() && absl::IsCancelled(s))) return s;
      if (Stopping()) {
        result_.stopped = true;
        o_.logger->info("stop requested: stopping after step {}", steps_done_);
        return absl::OkStatus();
      }
      const int64_t round = std::min<int64_t>(push_every_, total - steps_done_);
      // The gradient set of this push; the push that used it last must be
      // answered (its memory released) first.
      s = WaitPushes(o_.max_pushes_in_flight - 1);
      if (!s.ok()) return s;
      const int grads = static_cast<int>(pushes_made_ % grad_sets_);
      bool ahead = false;
      for (int64_t j = 0; j < round; ++j) {
        if (j + 1 == round && o_.pipeline && steps_done_ + 1 < total) {
          // The next round's parameters, read while this step computes.
          StartRead(1 - cur, steps_done_ + 1, clock_ + 1);
          ahead = true;
        }
        const absl::Span<const int64_t> examples = Examples(steps_done_);
        s = model_->Step(cur, grads, j, round, examples);
        if (!s.ok()) return s;
        ++steps_done_;
        ++result_.steps;
        result_.examples += examples.size();
        ++window_steps_;
        window_examples_ += examples.size();
        if (steps_done_ % o_.log_every_steps == 0) {
          model_->Progress(Position());
          window_start_ = o_.clock->Now();
          window_steps_ = window_examples_ = 0;
        }
        if (o_.evaluate && eval_every > 0 && steps_done_ % eval_every == 0) {
          s = model_->Evaluate(cur, /*final=*/false, Position());
          if (!s.ok()) return s;
        }
      }
      if (!ahead && steps_done_ < total) {
        // The push and the next round's read, as one step.
        model_->StartPushThenRead(cur, grads, clock_, steps_done_,
                                  Examples(steps_done_));
      } else {
        model_->StartPush(cur, grads, clock_);
      }
      in_flight_.push_back({grads, steps_done_});
      ++pushes_made_;
      ++clock_;
      if (ahead) cur = 1 - cur;
    }
    return absl::OkStatus();
  }

  // Waits for the oldest pushes until at most `keep` are in flight.
  absl::Status WaitPushes(size_t keep) {
    while (in_flight_.size() > keep) {
      const InFlight push = in_flight_.front();
      in_flight_.pop_front();
      absl::Status s = model_->WaitPush(push.grads);
      if (!s.ok()) return s;
      // Pushes are waited for in order: every step up to this push's last
      // is acknowledged by every shard.
      store_->ReportTrained(push.steps_after);
    }
    return absl::OkStatus();
  }

  // A failed run still leaves (best effort) so that SSP/BSP peers need not
  // wait out its lease.
  absl::Status Abort(const absl::Status& s) {
    model_->DropPushes();
    in_flight_.clear();
    store_->Heartbeat(clock_, /*leaving=*/true).IgnoreError();
    return s;
  }

  std::string Timestamp() const {
    return absl::FormatTime("%Y-%m-%d %H:%M:%S", o_.clock->Now(),
                            absl::LocalTimeZone());
  }

  LoopPosition Position() const {
    const absl::Time now = o_.clock->Now();
    LoopPosition p;
    p.step = steps_done_;
    p.clock = clock_;
    p.total_steps = plan_.total_steps;
    p.steps_per_epoch = plan_.steps_per_epoch;
    p.wall_s = absl::ToDoubleSeconds(now - start_);
    p.window_s = std::max(absl::ToDoubleSeconds(now - window_start_), 1e-9);
    p.window_steps = window_steps_;
    p.window_examples = window_examples_;
    p.timestamp = Timestamp();
    const double rate = window_steps_ / p.window_s;  // steps per second
    p.eta = FormatEta(rate > 0 ? (p.total_steps - p.step) / rate : -1);
    return p;
  }

  const LoopOptions& o_;
  const int64_t num_examples_;
  const int push_every_;
  ParameterStore* const store_;
  TrainingModel* const model_;

  TrainingPlan plan_;
  int grad_sets_ = 1;
  // A push in flight: its gradient set, and the data position once it is
  // acknowledged.
  struct InFlight {
    int grads = 0;
    int64_t steps_after = 0;
  };
  std::deque<InFlight> in_flight_;
  int64_t pushes_made_ = 0;
  std::vector<int64_t> order_;
  int64_t order_epoch_ = -1;
  absl::Time start_;
  absl::Time window_start_;
  int64_t window_steps_ = 0;
  int64_t window_examples_ = 0;
  int64_t clock_ = 0;
  int64_t steps_done_ = 0;
  LoopResult result_;
};

}  // namespace

absl::StatusOr<LoopResult> RunTrainingLoop(const LoopOptions& options,
                                           int64_t num_examples, int push_every,
                                           ParameterStore* store,
                                           TrainingModel* model) {
  Loop loop(options, num_examples, push_every, store, model);
  return loop.Go();
}

}  // namespace asyncps
