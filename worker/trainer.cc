#include "worker/trainer.h"

#include <algorithm>
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

// Host-side parameter and gradient buffers, one per model tensor, in the
// backend's host memory (pinned for CUDA): pulls land there and copies to
// and from the device run at full speed.
struct HostTensors {
  std::vector<HostBuffer> params, grads;
  std::vector<std::pair<std::string, float*>> pull_targets;
  std::vector<std::pair<std::string, const float*>> push_sources;
  std::vector<const float*> param_ptrs;
  std::vector<float*> grad_ptrs;

  // Allocates the buffers; the backend's error if it cannot.
  absl::Status Init(const std::vector<ParamInfo>& infos, Backend* backend) {
    for (const ParamInfo& p : infos) {
      const size_t n = static_cast<size_t>(p.num_elements());
      absl::StatusOr<HostBuffer> param = HostBuffer::Make(backend, n);
      absl::StatusOr<HostBuffer> grad = HostBuffer::Make(backend, n);
      if (!param.ok()) return param.status();
      if (!grad.ok()) return grad.status();
      params.push_back(*std::move(param));
      grads.push_back(*std::move(grad));
    }
    for (size_t i = 0; i < infos.size(); ++i) {
      pull_targets.emplace_back(infos[i].name, params[i].data());
      push_sources.emplace_back(infos[i].name, grads[i].data());
      param_ptrs.push_back(params[i].data());
      grad_ptrs.push_back(grads[i].data());
    }
    return absl::OkStatus();
  }
};

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
    start_ = absl::Now();
    const int64_t steps_per_epoch =
        (share_.size() + o_.batch_size - 1) / o_.batch_size;
    const int64_t eval_every =
        o_.eval_every_steps > 0 ? o_.eval_every_steps : steps_per_epoch;
    std::vector<float> x(static_cast<size_t>(o_.batch_size) * train_.dim);
    std::vector<int32_t> y(o_.batch_size);
    bool done = false;
    for (int64_t epoch = 0; epoch < o_.epochs && !done; ++epoch) {
      const std::vector<int64_t> order =
          EpochOrder(share_, o_.seed, o_.worker_id, epoch);
      for (size_t at = 0; at < order.size(); at += o_.batch_size) {
        const int batch = static_cast<int>(
            std::min<size_t>(o_.batch_size, order.size() - at));
        for (int i = 0; i < batch; ++i) {
          const int64_t ex = order[at + i];
          std::copy_n(train_.images.data() + ex * train_.dim, train_.dim,
                      x.data() + static_cast<size_t>(i) * train_.dim);
          y[i] = train_.labels[ex];
        }
        s = Step(x.data(), y.data(), batch);
        if (!s.ok()) return s;
        if (result_.steps % o_.log_every_steps == 0) Progress(epoch);
        if (o_.evaluate && result_.steps % eval_every == 0) {
          s = Evaluate(epoch, /*final=*/false);
          if (!s.ok()) return s;
        }
        if (o_.max_steps > 0 && result_.steps >= o_.max_steps) {
          done = true;
          break;
        }
      }
      epoch_ = epoch + 1;
    }
    result_.wall_s = absl::ToDoubleSeconds(absl::Now() - start_);
    result_.examples_per_s = result_.examples / std::max(result_.wall_s, 1e-9);
    result_.mean_staleness =
        staleness_count_ ? staleness_sum_ / staleness_count_ : 0.0;
    s = store_->Heartbeat(clock_, /*leaving=*/true);
    if (!s.ok()) return s;
    std::fprintf(o_.progress,
                 "worker %d done: %ld steps, %ld examples in %.1f s (%.0f "
                 "examples/s), refused slices %ld, staleness mean %.2f max "
                 "%lu\n",
                 o_.worker_id, static_cast<long>(result_.steps),
                 static_cast<long>(result_.examples), result_.wall_s,
                 result_.examples_per_s, static_cast<long>(result_.refused_slices),
                 result_.mean_staleness,
                 static_cast<unsigned long>(result_.max_staleness));
    std::fflush(o_.progress);
    if (o_.evaluate) {
      s = WaitForOthers();
      if (!s.ok()) return s;
      s = store_->Pull(clock_, host_->pull_targets);
      if (!s.ok()) return s;
      s = Evaluate(epoch_, /*final=*/true);
      if (!s.ok()) return s;
      s = store_->Heartbeat(clock_, /*leaving=*/true);
      if (!s.ok()) return s;
    }
    return result_;
  }

 private:
  absl::Status Setup() {
    if (o_.logger == nullptr) {
      return absl::InvalidArgumentError("TrainerOptions.logger is required");
    }
    if (o_.batch_size < 1 || o_.epochs < 1 || o_.log_every_steps < 1) {
      return absl::InvalidArgumentError(
          "batch_size, epochs and log_every_steps must be >= 1");
    }
    if (train_.dim != o_.layer_sizes.front() || test_.dim != train_.dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data has ", train_.dim, " features; the model's input is ",
          o_.layer_sizes.front()));
    }
    absl::StatusOr<Share> share =
        WorkerShare(train_.n, o_.num_workers, o_.worker_id);
    if (!share.ok()) return share.status();
    share_ = *share;
    if (share_.size() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker ", o_.worker_id, " of ", o_.num_workers,
          " has no training examples"));
    }
    absl::StatusOr<std::unique_ptr<Mlp>> mlp =
        Mlp::Create(o_.layer_sizes, o_.batch_size, backend_);
    if (!mlp.ok()) return mlp.status();
    mlp_ = *std::move(mlp);
    host_ = std::make_unique<HostTensors>();
    absl::Status hs = host_->Init(mlp_->params(), backend_);
    if (!hs.ok()) return hs;
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
    if (o_.evaluate && !o_.eval_csv.empty()) {
      csv_.open(o_.eval_csv, std::ios::trunc);
      if (!csv_) {
        return absl::InvalidArgumentError(
            absl::StrCat("cannot write ", o_.eval_csv));
      }
      csv_ << "wall_s,step,epoch,test_accuracy,test_loss,refused,"
              "mean_staleness,max_staleness\n";
    }
    o_.logger->info("worker {}/{}: {} examples [{}, {}), backend {}",
                    o_.worker_id, o_.num_workers, share_.size(), share_.begin,
                    share_.end, backend_->name());
    return absl::OkStatus();
  }

  absl::Status Step(const float* x, const int32_t* y, int batch) {
    absl::Status s = store_->Pull(clock_, host_->pull_targets);
    if (!s.ok()) return s;
    absl::StatusOr<SoftmaxXentResult> r = mlp_->ComputeGradients(
        host_->param_ptrs, x, y, batch, host_->grad_ptrs);
    if (!r.ok()) return r.status();
    if (o_.straggler_delay > absl::ZeroDuration()) {
      absl::SleepFor(o_.straggler_delay);
    }
    if (o_.delay_spike_prob > 0 &&
        std::uniform_real_distribution<double>(0, 1)(spike_rng_) <
            o_.delay_spike_prob) {
      absl::SleepFor(o_.delay_spike);
    }
    absl::StatusOr<PushSummary> push = store_->Push(clock_, host_->push_sources);
    if (!push.ok()) return push.status();
    ++clock_;
    ++result_.steps;
    result_.examples += batch;
    result_.applied_slices += push->applied;
    result_.refused_slices += push->refused_stale;
    const int64_t n = push->applied + push->refused_stale;
    staleness_sum_ += push->mean_staleness * n;
    staleness_count_ += n;
    window_staleness_sum_ += push->mean_staleness * n;
    window_staleness_count_ += n;
    result_.max_staleness = std::max(result_.max_staleness, push->max_staleness);
    window_max_staleness_ = std::max(window_max_staleness_, push->max_staleness);
    window_loss_ += r->mean_loss;
    window_correct_ += r->correct;
    window_examples_ += batch;
    ++window_steps_;
    return absl::OkStatus();
  }

  void Progress(int64_t epoch) {
    const absl::Time now = absl::Now();
    const double dt = absl::ToDoubleSeconds(now - (last_progress_ == absl::InfinitePast() ? start_ : last_progress_));
    std::fprintf(
        o_.progress,
        "worker %d epoch %ld step %ld loss %.4f train_acc %.3f examples/s %.0f "
        "staleness mean %.2f max %lu refused %ld\n",
        o_.worker_id, static_cast<long>(epoch), static_cast<long>(result_.steps),
        window_loss_ / std::max<int64_t>(window_steps_, 1),
        static_cast<double>(window_correct_) / std::max<int64_t>(window_examples_, 1),
        window_examples_ / std::max(dt, 1e-9),
        window_staleness_count_ ? window_staleness_sum_ / window_staleness_count_ : 0.0,
        static_cast<unsigned long>(window_max_staleness_),
        static_cast<long>(result_.refused_slices));
    std::fflush(o_.progress);
    last_progress_ = now;
    window_loss_ = 0;
    window_correct_ = window_examples_ = window_steps_ = 0;
    window_staleness_sum_ = 0;
    window_staleness_count_ = 0;
    window_max_staleness_ = 0;
  }

  absl::Status Evaluate(int64_t epoch, bool final) {
    absl::StatusOr<SoftmaxXentResult> r = mlp_->Evaluate(
        host_->param_ptrs, test_.images.data(), test_.labels.data(), test_.n);
    if (!r.ok()) return r.status();
    const double acc = static_cast<double>(r->correct) / test_.n;
    const double wall = absl::ToDoubleSeconds(absl::Now() - start_);
    if (final) {
      result_.final_accuracy = acc;
      result_.final_loss = r->mean_loss;
      std::fprintf(o_.progress, "final test loss: %.4f\n", r->mean_loss);
      std::fprintf(o_.progress, "final test accuracy: %.4f\n", acc);
    } else {
      std::fprintf(o_.progress,
                   "eval epoch %ld step %ld wall %.1f s: test accuracy %.4f "
                   "loss %.4f\n",
                   static_cast<long>(epoch), static_cast<long>(result_.steps),
                   wall, acc, r->mean_loss);
    }
    std::fflush(o_.progress);
    if (csv_.is_open()) {
      csv_ << absl::StrFormat(
          "%.3f,%d,%d,%.4f,%.4f,%d,%.3f,%d\n", wall, result_.steps, epoch, acc,
          r->mean_loss, result_.refused_slices,
          staleness_count_ ? staleness_sum_ / staleness_count_ : 0.0,
          result_.max_staleness);
      csv_.flush();
    }
    return absl::OkStatus();
  }

  // The final model is the one after every worker's last push.
  absl::Status WaitForOthers() {
    const absl::Time deadline = absl::Now() + o_.final_wait;
    for (;;) {
      absl::StatusOr<int> live = store_->LiveWorkers();
      if (!live.ok()) return live.status();
      if (*live == 0) return absl::OkStatus();
      if (absl::Now() > deadline) {
        o_.logger->warn("{} worker(s) still training after {}; evaluating now",
                        *live, absl::FormatDuration(o_.final_wait));
        return absl::OkStatus();
      }
      absl::SleepFor(absl::Milliseconds(200));
    }
  }

  const TrainerOptions& o_;
  const Dataset& train_;
  const Dataset& test_;
  ParameterStore* const store_;
  Backend* const backend_;

  Share share_;
  std::unique_ptr<Mlp> mlp_;
  std::unique_ptr<HostTensors> host_;
  std::mt19937_64 spike_rng_;
  std::ofstream csv_;
  absl::Time start_;
  absl::Time last_progress_ = absl::InfinitePast();
  int64_t clock_ = 0;
  int64_t epoch_ = 0;
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
