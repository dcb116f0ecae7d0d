#include "worker/trainer.h"

#include <algorithm>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/mlp.h"

namespace asyncps {

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

class MlpModel : public TrainingModel {
 public:
  MlpModel(const TrainerOptions& o, const Dataset& train, const Dataset& test,
           ParameterStore* store, Backend* backend, TrainResult* result)
      : o_(o),
        train_(train),
        test_(test),
        store_(store),
        backend_(backend),
        result_(result),
        spike_rng_(o.seed * 1000003u + static_cast<uint64_t>(o.worker_id)) {}

  absl::Status Setup(const TrainingPlan& plan, int read_sets,
                     int grad_sets) override {
    if (train_.dim != o_.layer_sizes.front() || test_.dim != train_.dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data has ", train_.dim, " features; the model's input is ",
          o_.layer_sizes.front()));
    }
    absl::StatusOr<std::unique_ptr<Mlp>> mlp =
        Mlp::Create(o_.layer_sizes, o_.batch_size, backend_);
    if (!mlp.ok()) return mlp.status();
    mlp_ = *std::move(mlp);
    x_.resize(static_cast<size_t>(o_.batch_size) * train_.dim);
    y_.resize(o_.batch_size);
    // The read and gradient sets, and the per-step gradient when pushing
    // every few steps.
    const int sets = read_sets + grad_sets + (o_.push_every > 1 ? 1 : 0);
    for (int i = 0; i < sets; ++i) {
      auto set = std::make_unique<TensorSet>();
      absl::Status s = set->Init(mlp_->params(), backend_);
      if (!s.ok()) return s;
      if (i < read_sets) {
        reads_.push_back({std::move(set), nullptr});
      } else if (i < read_sets + grad_sets) {
        grads_.push_back({std::move(set), nullptr});
      } else {
        step_grads_ = std::move(set);
      }
    }
    const std::vector<TensorSpec> specs =
        MlpSpecs(o_.layer_sizes, o_.optimizer, o_.seed);
    if (o_.create) {
      absl::Status s = store_->Create(specs, /*tables=*/{});
      if (!s.ok()) return s;
      o_.logger->info("created {} parameter tensors", specs.size());
      return absl::OkStatus();
    }
    std::vector<std::string> names;
    for (const TensorSpec& t : specs) names.push_back(t.name());
    return store_->WaitFor(names, o_.wait_for_tensors);
  }

  absl::Status Begin(const TrainingPlan& plan) override {
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
        o_.worker_id, o_.num_workers, plan.share.size(), plan.share.begin,
        plan.share.end, plan.total_steps, backend_->name(),
        o_.pipeline ? "on" : "off", o_.push_every);
    return absl::OkStatus();
  }

  void StartRead(int set, int64_t step, absl::Span<const int64_t> examples,
                 int64_t clock, int64_t for_clock) override {
    reads_[set].pull = store_->StartPull(clock, for_clock,
                                         PullSet{reads_[set].set->named, {}});
  }

  absl::Status WaitRead(int set) override { return reads_[set].pull->Wait(); }

  // One step's gradient into the gradient set: the gradient itself when
  // pushing every step; otherwise summed over the round, with the step
  // applied to the local copy of the parameters (plain SGD) unless it is
  // the last.
  absl::Status Step(int set, int grads, int64_t j, int64_t round,
                    absl::Span<const int64_t> examples) override {
    const int batch = static_cast<int>(examples.size());
    for (int i = 0; i < batch; ++i) {
      std::copy_n(train_.images.data() + examples[i] * train_.dim, train_.dim,
                  x_.data() + static_cast<size_t>(i) * train_.dim);
      y_[i] = train_.labels[examples[i]];
    }
    TensorSet& params = *reads_[set].set;
    TensorSet& sum = *grads_[grads].set;
    TensorSet& out = o_.push_every == 1 ? sum : *step_grads_;
    absl::StatusOr<SoftmaxXentResult> r = mlp_->ComputeGradients(
        params.ptrs, x_.data(), y_.data(), batch, out.mutable_ptrs);
    if (!r.ok()) return r.status();
    window_loss_ += r->mean_loss;
    window_correct_ += r->correct;
    window_examples_ += batch;
    ++window_steps_;
    if (o_.push_every > 1) {
      const float lr = o_.optimizer.learning_rate();
      const std::vector<ParamInfo>& infos = mlp_->params();
      for (size_t t = 0; t < infos.size(); ++t) {
        const int64_t n = infos[t].num_elements();
        float* acc = sum.mutable_ptrs[t];
        const float* g = out.ptrs[t];
        float* w = params.mutable_ptrs[t];
        for (int64_t i = 0; i < n; ++i) {
          acc[i] = (j == 0 ? 0.0f : acc[i]) + g[i];
          if (j + 1 < round) w[i] -= lr * g[i];
        }
      }
    }
    Delay();
    return absl::OkStatus();
  }

  void StartPush(int set, int grads, int64_t clock) override {
    grads_[grads].push =
        store_->StartPush(clock, PushSet{grads_[grads].set->named_const, {}},
                          reads_[set].pull->read());
  }

  void StartPushThenRead(int set, int grads, int64_t clock, int64_t /*step*/,
                         absl::Span<const int64_t> /*examples*/) override {
    ParameterStore::Step step = store_->StartStep(
        clock, PushSet{grads_[grads].set->named_const, {}},
        reads_[set].pull->read(), PullSet{reads_[set].set->named, {}});
    grads_[grads].push = std::move(step.push);
    reads_[set].pull = std::move(step.pull);
  }

  absl::Status WaitPush(int grads) override {
    absl::StatusOr<PushSummary> push = grads_[grads].push->Wait();
    grads_[grads].push.reset();
    if (!push.ok()) return push.status();
    const int64_t refused = push->refused_stale + push->refused_restored;
    result_->applied_slices += push->applied;
    result_->refused_slices += refused;
    const int64_t n = push->applied + push->refused_stale;
    staleness_sum_ += push->mean_staleness * n;
    staleness_count_ += n;
    window_staleness_sum_ += push->mean_staleness * n;
    window_staleness_count_ += n;
    result_->max_staleness =
        std::max(result_->max_staleness, push->max_staleness);
    window_max_staleness_ =
        std::max(window_max_staleness_, push->max_staleness);
    result_->mean_staleness =
        staleness_count_ ? staleness_sum_ / staleness_count_ : 0.0;
    return absl::OkStatus();
  }

  void DropPushes() override {
    for (Slot& g : grads_) g.push.reset();  // each waits for its own end
  }

  absl::Status Evaluate(int set, bool final, const LoopPosition& at) override {
    TensorSet& params = *reads_[set].set;
    if (final) {
      absl::Status s =
          store_->StartPull(at.clock, at.clock, PullSet{params.named, {}})
              ->Wait();
      if (!s.ok()) return s;
    }
    absl::StatusOr<SoftmaxXentResult> r = mlp_->Evaluate(
        params.ptrs, test_.images.data(), test_.labels.data(), test_.n);
    if (!r.ok()) return r.status();
    const double acc = static_cast<double>(r->correct) / test_.n;
    const int64_t epoch = at.step / at.steps_per_epoch;
    if (final) {
      result_->final_accuracy = acc;
      result_->final_loss = r->mean_loss;
      std::fprintf(o_.progress, "final test loss: %.4f\n", r->mean_loss);
      std::fprintf(o_.progress, "final test accuracy: %.4f\n", acc);
    } else {
      std::fprintf(o_.progress,
                   "%s eval epoch %ld step %ld wall %.1f s: test accuracy "
                   "%.4f loss %.4f\n",
                   at.timestamp.c_str(), static_cast<long>(epoch),
                   static_cast<long>(at.step), at.wall_s, acc, r->mean_loss);
    }
    std::fflush(o_.progress);
    if (csv_.is_open()) {
      csv_ << absl::StrFormat("%.3f,%d,%d,%.4f,%.4f,%d,%.3f,%d\n", at.wall_s,
                              at.step, epoch, acc, r->mean_loss,
                              result_->refused_slices, result_->mean_staleness,
                              result_->max_staleness);
      csv_.flush();
    }
    return absl::OkStatus();
  }

  void Progress(const LoopPosition& at) override {
    std::fprintf(
        o_.progress,
        "%s worker %d epoch %ld/%ld step %ld/%ld (%.1f%%) loss %.4f train_acc "
        "%.3f examples/s %.0f staleness mean %.2f max %lu refused %ld ETA %s\n",
        at.timestamp.c_str(), o_.worker_id,
        static_cast<long>(at.step / at.steps_per_epoch + 1),
        static_cast<long>((at.total_steps + at.steps_per_epoch - 1) /
                          at.steps_per_epoch),
        static_cast<long>(at.step), static_cast<long>(at.total_steps),
        100.0 * at.step / std::max<int64_t>(at.total_steps, 1),
        window_loss_ / std::max<int64_t>(window_steps_, 1),
        static_cast<double>(window_correct_) /
            std::max<int64_t>(window_examples_, 1),
        at.window_examples / at.window_s,
        window_staleness_count_
            ? window_staleness_sum_ / window_staleness_count_
            : 0.0,
        static_cast<unsigned long>(window_max_staleness_),
        static_cast<long>(result_->refused_slices), at.eta.c_str());
    std::fflush(o_.progress);
    window_loss_ = 0;
    window_correct_ = window_examples_ = window_steps_ = 0;
    window_staleness_sum_ = 0;
    window_staleness_count_ = 0;
    window_max_staleness_ = 0;
  }

  std::string Summary() const override {
    return absl::StrFormat("refused slices %d, staleness mean %.2f max %d",
                           result_->refused_slices, result_->mean_staleness,
                           result_->max_staleness);
  }

 private:
  void Delay() {
    if (o_.straggler_delay > absl::ZeroDuration()) {
      absl::SleepFor(o_.straggler_delay);
    }
    if (o_.delay_spike_prob > 0 && std::uniform_real_distribution<double>(0, 1)(
                                       spike_rng_) < o_.delay_spike_prob) {
      absl::SleepFor(o_.delay_spike);
    }
  }

  const TrainerOptions& o_;
  const Dataset& train_;
  const Dataset& test_;
  ParameterStore* const store_;
  Backend* const backend_;
  TrainResult* const result_;

  std::unique_ptr<Mlp> mlp_;
  std::vector<float> x_;
  std::vector<int32_t> y_;
  // A buffer set and the call in flight on it: a read set's pull, or a
  // gradient set's push (reset once waited for).
  struct Slot {
    std::unique_ptr<TensorSet> set;
    std::unique_ptr<ParameterStore::PendingPull> pull;
    std::unique_ptr<ParameterStore::PendingPush> push;
  };
  std::vector<Slot> reads_, grads_;
  std::unique_ptr<TensorSet> step_grads_;
  std::mt19937_64 spike_rng_;
  std::ofstream csv_;
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
  TrainResult result;
  MlpModel model(options, train, test, store, backend, &result);
  absl::StatusOr<LoopResult> loop =
      RunTrainingLoop(options, train.n, options.push_every, store, &model);
  if (!loop.ok()) return loop.status();
  static_cast<LoopResult&>(result) = *loop;
  return result;
}

}  // namespace asyncps
