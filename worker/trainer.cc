#include "worker/trainer.h"

#include <algorithm>
#include <deque>
#include <fstream>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/mlp.h"
#include "worker/partition.h"

namespace asyncps {

std::vector<TensorSpec> ModelSpecs(const std::vector<int>& layer_sizes,
                                   const OptimizerSpec& optimizer,
                                   uint64_t seed) {
  std::vector<TensorSpec> specs;
  for (size_t l = 0; l + 1 < layer_sizes.size(); ++l) {
    TensorSpec w;
    w.set_name(absl::StrCat("fc", l, "/w"));
    w.add_shape(layer_sizes[l]);
    w.add_shape(layer_sizes[l + 1]);
    w.set_init(INIT_GLOROT_UNIFORM);
    w.set_seed(seed);
    *w.mutable_optimizer() = optimizer;
    specs.push_back(w);
    TensorSpec b;
    b.set_name(absl::StrCat("fc", l, "/b"));
    b.add_shape(layer_sizes[l + 1]);
    b.set_init(INIT_ZEROS);
    b.set_seed(seed);
    *b.mutable_optimizer() = optimizer;
    specs.push_back(b);
  }
  return specs;
}

namespace {

// One set of host buffers, one per model tensor, in the backend's host
// memory (pinned for CUDA), and the views the store and the model take.
struct TensorSet {
  std::vector<HostBuffer> buffers;
  std::vector<std::pair<std::string, float*>> named;
  std::vector<std::pair<std::string, const float*>> named_const;
  std::vector<const float*> ptrs;
  std::vector<float*> mutable_ptrs;

  // Allocates the buffers; the backend's error if it cannot.
  absl::Status Init(const std::vector<ParamInfo>& infos, Backend* backend) {
    for (const ParamInfo& p : infos) {
      absl::StatusOr<HostBuffer> buffer =
          HostBuffer::Make(backend, static_cast<size_t>(p.num_elements()));
      if (!buffer.ok()) return buffer.status();
      buffers.push_back(*std::move(buffer));
    }
    for (size_t i = 0; i < infos.size(); ++i) {
      named.emplace_back(infos[i].name, buffers[i].data());
      named_const.emplace_back(infos[i].name, buffers[i].data());
      ptrs.push_back(buffers[i].data());
      mutable_ptrs.push_back(buffers[i].data());
    }
    return absl::OkStatus();
  }
};

std::string FormatEta(double seconds) {
  if (!(seconds >= 0) || seconds > 1e7) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, s / 60 % 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%ds", s);
}

class Run {
 public:
  Run(const TrainerOptions& o, const Dataset& train, const Dataset& test,
      ParameterStore* store, Backend* backend)
      : o_(o),
        train_(train),
        test_(test),
        store_(store),
        backend_(backend),
        spike_rng_(o.seed * 1000003u + static_cast<uint64_t>(o.worker_id)) {}

  absl::StatusOr<TrainResult> Go() {
    absl::Status s = Setup();
    if (!s.ok()) return s;
    result_.total_steps = total_steps_;
    if (result_.already_trained) {
      // Nothing to push; the shards stop counting this process.
      s = store_->Heartbeat(clock_, /*leaving=*/true);
      if (!s.ok()) return s;
      return result_;
    }
    start_ = o_.clock->Now();
    s = Loop();
    if (!s.ok()) return Abort(s);
    // Every push this worker made is answered before it leaves, which
    // reports the final data position.
    s = DrainPushes();
    if (!s.ok()) return Abort(s);
    result_.wall_s = absl::ToDoubleSeconds(o_.clock->Now() - start_);
    result_.examples_per_s = result_.examples / std::max(result_.wall_s, 1e-9);
    result_.mean_staleness =
        staleness_count_ ? staleness_sum_ / staleness_count_ : 0.0;
    s = store_->Heartbeat(clock_, /*leaving=*/true);
    if (!s.ok()) return s;
    std::fprintf(
        o_.progress,
        "%s worker %d %s: steps %ld..%ld (%ld examples) in %.1f s, %.0f "
        "examples/s, refused slices %ld, staleness mean %.2f max %lu\n",
        Timestamp().c_str(), o_.worker_id,
        result_.stopped ? "stopped early" : "done",
        static_cast<long>(result_.first_step), static_cast<long>(steps_done_),
        static_cast<long>(result_.examples), result_.wall_s,
        result_.examples_per_s, static_cast<long>(result_.refused_slices),
        result_.mean_staleness,
        static_cast<unsigned long>(result_.max_staleness));
    std::fflush(o_.progress);
    if (o_.evaluate && !result_.stopped) {
      // The final model is the one after every worker's last push.
      s = WaitForOtherWorkers(store_, o_.final_wait, o_.clock, o_.stop,
                              *o_.logger);
      if (!s.ok()) return s;
      std::unique_ptr<ParameterStore::PendingPull> last =
          store_->StartPull(clock_, clock_, params_[0]->named);
      s = last->Wait();
      if (!s.ok()) return s;
      s = Evaluate(*params_[0], /*final=*/true);
      if (!s.ok()) return s;
      s = store_->Heartbeat(clock_, /*leaving=*/true);
      if (!s.ok()) return s;
    }
    return result_;
  }

 private:
  absl::Status Setup() {
    if (o_.logger == nullptr || o_.clock == nullptr) {
      return absl::InvalidArgumentError(
          "TrainerOptions.logger and clock are required");
    }
    if (o_.batch_size < 1 || o_.epochs < 1 || o_.log_every_steps < 1 ||
        o_.max_pushes_in_flight < 1 || o_.push_every < 1) {
      return absl::InvalidArgumentError(
          "batch_size, epochs, log_every_steps, max_pushes_in_flight and "
          "push_every must be >= 1");
    }
    if (train_.dim != o_.layer_sizes.front() || test_.dim != train_.dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data has ", train_.dim, " features; the model's input is ",
          o_.layer_sizes.front()));
    }
    absl::StatusOr<TrainingPlan> plan =
        PlanTraining(train_.n, o_.num_workers, o_.worker_id, o_.batch_size,
                     o_.epochs, o_.max_steps);
    if (!plan.ok()) return plan.status();
    share_ = plan->share;
    steps_per_epoch_ = plan->steps_per_epoch;
    total_steps_ = plan->total_steps;
    absl::StatusOr<std::unique_ptr<Mlp>> mlp =
        Mlp::Create(o_.layer_sizes, o_.batch_size, backend_);
    if (!mlp.ok()) return mlp.status();
    mlp_ = *std::move(mlp);
    // Two parameter sets, one gradient set per push in flight plus one,
    // and the per-step gradient when pushing every few steps.
    const int grad_sets = o_.max_pushes_in_flight + 1;
    for (int i = 0; i < 2 + grad_sets + (o_.push_every > 1 ? 1 : 0); ++i) {
      auto set = std::make_unique<TensorSet>();
      absl::Status hs = set->Init(mlp_->params(), backend_);
      if (!hs.ok()) return hs;
      if (i < 2) {
        params_.push_back(std::move(set));
      } else if (i < 2 + grad_sets) {
        grads_.push_back(std::move(set));
      } else {
        step_grads_ = std::move(set);
      }
    }
    const std::vector<TensorSpec> specs =
        ModelSpecs(o_.layer_sizes, o_.optimizer, o_.seed);
    if (o_.create_tensors) {
      absl::Status s = store_->Create(specs);
      if (!s.ok()) return s;
      o_.logger->info("created {} parameter tensors", specs.size());
    } else {
      std::vector<std::string> names;
      for (const TensorSpec& t : specs) names.push_back(t.name());
      absl::Status s = store_->WaitFor(names, o_.wait_for_tensors);
      if (!s.ok()) return s;
    }
    absl::StatusOr<Registration> reg = store_->Register();
    if (!reg.ok()) return reg.status();
    clock_ = reg->resume_clock;
    // The data position, not the clock, says where the share continues.
    const ShareStart start =
        StartShare(*reg, total_steps_, o_.worker_id, *o_.logger);
    steps_done_ = trained_ = result_.first_step = start.step;
    result_.already_trained = start.already_trained;
    if (start.already_trained) return absl::OkStatus();
    if (o_.evaluate && !o_.eval_csv.empty()) {
      csv_.open(o_.eval_csv, std::ios::trunc);
      if (!csv_) {
        return absl::InvalidArgumentError(
            absl::StrCat("cannot write ", o_.eval_csv));
      }
      csv_ << "wall_s,step,epoch,test_accuracy,test_loss,refused,"
              "mean_staleness,max_staleness\n";
    }
    o_.logger->info(
        "worker {}/{}: {} examples [{}, {}), {} steps, backend {}, pipeline "
        "{}, push every {} step(s)",
        o_.worker_id, o_.num_workers, share_.size(), share_.begin, share_.end,
        total_steps_, backend_->name(), o_.pipeline ? "on" : "off",
        o_.push_every);
    return absl::OkStatus();
  }

  bool StopRequested() const {
    return o_.stop != nullptr && o_.stop->load(std::memory_order_relaxed);
  }

  // The minibatch of step `step` (epoch step / steps_per_epoch, shuffled
  // per epoch) into x, y; returns its size.
  int Batch(int64_t step, float* x, int32_t* y) {
    const int64_t epoch = step / steps_per_epoch_;
    if (epoch != order_epoch_) {
      order_ = EpochOrder(share_, o_.seed, o_.worker_id, epoch);
      order_epoch_ = epoch;
    }
    const size_t at =
        static_cast<size_t>(step % steps_per_epoch_) * o_.batch_size;
    const int batch =
        static_cast<int>(std::min<size_t>(o_.batch_size, order_.size() - at));
    for (int i = 0; i < batch; ++i) {
      const int64_t ex = order_[at + i];
      std::copy_n(train_.images.data() + ex * train_.dim, train_.dim,
                  x + static_cast<size_t>(i) * train_.dim);
      y[i] = train_.labels[ex];
    }
    return batch;
  }

  absl::Status Loop() {
    std::vector<float> x(static_cast<size_t>(o_.batch_size) * train_.dim);
    std::vector<int32_t> y(o_.batch_size);
    const int64_t eval_every =
        o_.eval_every_steps > 0 ? o_.eval_every_steps : steps_per_epoch_;
    int cur = 0;  // params_[cur] receives the pull for the coming round
    std::unique_ptr<ParameterStore::PendingPull> pull;
    if (steps_done_ < total_steps_) {
      pull = store_->StartPull(clock_, clock_, params_[cur]->named);
    }
    while (steps_done_ < total_steps_) {
      absl::Status s = pull->Wait();
      // A stop ends a pull that waits (e.g. for slower workers) at once.
      if (!s.ok() && !(StopRequested() && absl::IsCancelled(s))) return s;
      const ReadSet read = pull->read();
      pull.reset();
      if (StopRequested()) {
        result_.stopped = true;
        o_.logger->info("stop requested: stopping after step {}", steps_done_);
        return absl::OkStatus();
      }
      TensorSet& params = *params_[cur];
      const int64_t round =
          std::min<int64_t>(o_.push_every, total_steps_ - steps_done_);
      // The gradient buffer of this push; the push that used it last must
      // be answered (its memory released) first.
      while (pushes_.size() >= static_cast<size_t>(o_.max_pushes_in_flight)) {
        s = WaitOldestPush();
        if (!s.ok()) return s;
      }
      TensorSet& grads = *grads_[pushes_made_ % grads_.size()];
      for (int64_t j = 0; j < round; ++j) {
        const bool last = j + 1 == round;
        if (last && o_.pipeline && steps_done_ + 1 < total_steps_) {
          // The next round's parameters, read while this step computes.
          pull = store_->StartPull(clock_, clock_ + 1, params_[1 - cur]->named);
        }
        const int batch = Batch(steps_done_, x.data(), y.data());
        s = ComputeStep(params, grads, j, round, x.data(), y.data(), batch);
        if (!s.ok()) return s;
        Delay();
        ++steps_done_;
        ++result_.steps;
        result_.examples += batch;
        if (steps_done_ % o_.log_every_steps == 0) Progress();
        if (o_.evaluate && steps_done_ % eval_every == 0) {
          s = Evaluate(params, /*final=*/false);
          if (!s.ok()) return s;
        }
      }
      pushes_.push_back(
          {store_->StartPush(clock_, grads.named_const, read), steps_done_});
      ++pushes_made_;
      ++clock_;
      if (pull != nullptr) {
        cur = 1 - cur;
      } else if (steps_done_ < total_steps_) {
        pull = store_->StartPull(clock_, clock_, params_[cur]->named);
      }
    }
    return absl::OkStatus();
  }

  // One step's gradient into `grads`: the gradient itself when pushing
  // every step; otherwise summed over the round, with the step applied to
  // the local copy of the parameters (plain SGD) unless it is the last.
  absl::Status ComputeStep(TensorSet& params, TensorSet& grads, int64_t j,
                           int64_t round, const float* x, const int32_t* y,
                           int batch) {
    TensorSet& out = o_.push_every == 1 ? grads : *step_grads_;
    absl::StatusOr<SoftmaxXentResult> r =
        mlp_->ComputeGradients(params.ptrs, x, y, batch, out.mutable_ptrs);
    if (!r.ok()) return r.status();
    window_loss_ += r->mean_loss;
    window_correct_ += r->correct;
    window_examples_ += batch;
    ++window_steps_;
    if (o_.push_every == 1) return absl::OkStatus();
    const float lr = o_.optimizer.learning_rate();
    const std::vector<ParamInfo>& infos = mlp_->params();
    for (size_t t = 0; t < infos.size(); ++t) {
      const int64_t n = infos[t].num_elements();
      float* sum = grads.mutable_ptrs[t];
      const float* g = out.ptrs[t];
      float* w = params.mutable_ptrs[t];
      for (int64_t i = 0; i < n; ++i) {
        sum[i] = (j == 0 ? 0.0f : sum[i]) + g[i];
        if (j + 1 < round) w[i] -= lr * g[i];
      }
    }
    return absl::OkStatus();
  }

  void Delay() {
    if (o_.straggler_delay > absl::ZeroDuration()) {
      absl::SleepFor(o_.straggler_delay);
    }
    if (o_.delay_spike_prob > 0 && std::uniform_real_distribution<double>(0, 1)(
                                       spike_rng_) < o_.delay_spike_prob) {
      absl::SleepFor(o_.delay_spike);
    }
  }

  absl::Status WaitOldestPush() {
    absl::StatusOr<PushSummary> push = pushes_.front().push->Wait();
    const int64_t steps = pushes_.front().steps_after;
    pushes_.pop_front();
    if (!push.ok()) return push.status();
    // Pushes are waited for in order: every step up to this push's last is
    // acknowledged by every shard.
    trained_ = steps;
    store_->ReportTrained(trained_);
    const int64_t refused = push->refused_stale + push->refused_restored;
    result_.applied_slices += push->applied;
    result_.refused_slices += refused;
    const int64_t n = push->applied + push->refused_stale;
    staleness_sum_ += push->mean_staleness * n;
    staleness_count_ += n;
    window_staleness_sum_ += push->mean_staleness * n;
    window_staleness_count_ += n;
    result_.max_staleness =
        std::max(result_.max_staleness, push->max_staleness);
    window_max_staleness_ =
        std::max(window_max_staleness_, push->max_staleness);
    return absl::OkStatus();
  }

  absl::Status DrainPushes() {
    while (!pushes_.empty()) {
      absl::Status s = WaitOldestPush();
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // A failed run still leaves (best effort) so that SSP/BSP peers need not
  // wait out its lease.
  absl::Status Abort(const absl::Status& s) {
    pushes_.clear();  // each waits for its own end
    store_->Heartbeat(clock_, /*leaving=*/true).IgnoreError();
    return s;
  }

  std::string Timestamp() const {
    return absl::FormatTime("%Y-%m-%d %H:%M:%S", o_.clock->Now(),
                            absl::LocalTimeZone());
  }

  void Progress() {
    const absl::Time now = o_.clock->Now();
    const absl::Time since =
        last_progress_ == absl::InfinitePast() ? start_ : last_progress_;
    const double dt = std::max(absl::ToDoubleSeconds(now - since), 1e-9);
    const double rate = window_steps_ / dt;  // steps per second
    const int64_t left = total_steps_ - steps_done_;
    std::fprintf(
        o_.progress,
        "%s worker %d epoch %ld/%ld step %ld/%ld (%.1f%%) loss %.4f train_acc "
        "%.3f examples/s %.0f staleness mean %.2f max %lu refused %ld ETA %s\n",
        Timestamp().c_str(), o_.worker_id,
        static_cast<long>(steps_done_ / steps_per_epoch_ + 1),
        static_cast<long>((total_steps_ + steps_per_epoch_ - 1) /
                          steps_per_epoch_),
        static_cast<long>(steps_done_), static_cast<long>(total_steps_),
        100.0 * steps_done_ / std::max<int64_t>(total_steps_, 1),
        window_loss_ / std::max<int64_t>(window_steps_, 1),
        static_cast<double>(window_correct_) /
            std::max<int64_t>(window_examples_, 1),
        window_examples_ / dt,
        window_staleness_count_
            ? window_staleness_sum_ / window_staleness_count_
            : 0.0,
        static_cast<unsigned long>(window_max_staleness_),
        static_cast<long>(result_.refused_slices),
        FormatEta(rate > 0 ? left / rate : -1).c_str());
    std::fflush(o_.progress);
    last_progress_ = now;
    window_loss_ = 0;
    window_correct_ = window_examples_ = window_steps_ = 0;
    window_staleness_sum_ = 0;
    window_staleness_count_ = 0;
    window_max_staleness_ = 0;
  }

  absl::Status Evaluate(const TensorSet& params, bool final) {
    absl::StatusOr<SoftmaxXentResult> r = mlp_->Evaluate(
        params.ptrs, test_.images.data(), test_.labels.data(), test_.n);
    if (!r.ok()) return r.status();
    const double acc = static_cast<double>(r->correct) / test_.n;
    const double wall = absl::ToDoubleSeconds(o_.clock->Now() - start_);
    const int64_t epoch = steps_done_ / steps_per_epoch_;
    if (final) {
      result_.final_accuracy = acc;
      result_.final_loss = r->mean_loss;
      std::fprintf(o_.progress, "final test loss: %.4f\n", r->mean_loss);
      std::fprintf(o_.progress, "final test accuracy: %.4f\n", acc);
    } else {
      std::fprintf(o_.progress,
                   "%s eval epoch %ld step %ld wall %.1f s: test accuracy "
                   "%.4f loss %.4f\n",
                   Timestamp().c_str(), static_cast<long>(epoch),
                   static_cast<long>(steps_done_), wall, acc, r->mean_loss);
    }
    std::fflush(o_.progress);
    if (csv_.is_open()) {
      csv_ << absl::StrFormat(
          "%.3f,%d,%d,%.4f,%.4f,%d,%.3f,%d\n", wall, steps_done_, epoch, acc,
          r->mean_loss, result_.refused_slices,
          staleness_count_ ? staleness_sum_ / staleness_count_ : 0.0,
          result_.max_staleness);
      csv_.flush();
    }
    return absl::OkStatus();
  }

  const TrainerOptions& o_;
  const Dataset& train_;
  const Dataset& test_;
  ParameterStore* const store_;
  Backend* const backend_;

  Share share_;
  int64_t steps_per_epoch_ = 1;
  int64_t total_steps_ = 0;
  std::unique_ptr<Mlp> mlp_;
  // Two parameter sets (one being pulled while the other computes), one
  // gradient set per push in flight plus one, and the per-step gradient when
  // pushing every few steps.
  std::vector<std::unique_ptr<TensorSet>> params_, grads_;
  std::unique_ptr<TensorSet> step_grads_;
  // A push in flight and the data position once it is acknowledged.
  struct InFlight {
    std::unique_ptr<ParameterStore::PendingPush> push;
    int64_t steps_after = 0;
  };
  std::deque<InFlight> pushes_;
  int64_t pushes_made_ = 0;
  std::vector<int64_t> order_;
  int64_t order_epoch_ = -1;
  std::mt19937_64 spike_rng_;
  std::ofstream csv_;
  absl::Time start_;
  absl::Time last_progress_ = absl::InfinitePast();
  int64_t clock_ = 0;
  int64_t steps_done_ = 0;  // steps computed (their pushes may be in flight)
  int64_t trained_ = 0;     // steps whose pushes every shard acknowledged
  TrainResult result_;
  double staleness_sum_ = 0;
  int64_t staleness_count_ = 0;
  double window_loss_ = 0;
  int64_t window_correct_ = 0, window_examples_ = 0, window_steps_ = 0;
  double window_staleness_sum_ = 0;
  int64_t window_staleness_count_ = 0;
  uint64_t window_max_staleness_ = 0;
};

}  // namespace

absl::StatusOr<TrainResult> Train(const TrainerOptions& options,
                                  const Dataset& train, const Dataset& test,
                                  ParameterStore* store, Backend* backend) {
  Run run(options, train, test, store, backend);
  return run.Go();
}

}  // namespace asyncps
