#include "worker/ctr_trainer.h"

#include <algorithm>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/ctr_model.h"
#include "worker/partition.h"

namespace asyncps {

namespace {

// The MLP's dense tensors in one block of host memory (pinned for CUDA),
// and the views the stores and the model take.
class DenseSet {
 public:
  absl::Status Init(const std::vector<ParamInfo>& params, Backend* backend) {
    size_t total = 0;
    for (const ParamInfo& p : params) total += p.num_elements();
    absl::StatusOr<HostBuffer> block = HostBuffer::Make(backend, total);
    if (!block.ok()) return block.status();
    block_ = *std::move(block);
    float* at = block_.data();
    for (const ParamInfo& p : params) {
      pulls_.emplace_back(p.name, at);
      pushes_.emplace_back(p.name, at);
      reads_.push_back(at);
      writes_.push_back(at);
      at += p.num_elements();
    }
    return absl::OkStatus();
  }
  const std::vector<std::pair<std::string, float*>>& pulls() const {
    return pulls_;
  }
  const std::vector<std::pair<std::string, const float*>>& pushes() const {
    return pushes_;
  }
  const std::vector<const float*>& reads() const { return reads_; }
  const std::vector<float*>& writes() const { return writes_; }

 private:
  HostBuffer block_;
  std::vector<std::pair<std::string, float*>> pulls_;
  std::vector<std::pair<std::string, const float*>> pushes_;
  std::vector<const float*> reads_;
  std::vector<float*> writes_;
};

// One step's minibatch and the parameters pulled for it.
struct StepSlot {
  int64_t step = -1;
  std::vector<int64_t> indices;
  CtrExamples examples;
  std::vector<std::vector<uint64_t>> ids;  // per field: the batch's ids
  std::vector<float> emb;                  // fields x batch x dim
  DenseSet params;
  std::unique_ptr<ParameterStore::PendingPull> dense_pull;
  std::unique_ptr<RowStore::PendingPull> rows_pull;
};

// The pushes of one step, and the data position once both are answered.
struct StepPush {
  std::unique_ptr<ParameterStore::PendingPush> dense;
  std::unique_ptr<RowStore::PendingPush> rows;
  int64_t steps_after = 0;
};

class CtrRun {
 public:
  CtrRun(const CtrTrainerOptions& o, ParameterStore* dense, RowStore* rows,
         Backend* backend)
      : o_(o), dense_(dense), rows_(rows), backend_(backend), data_(o.data) {}

  absl::StatusOr<CtrResult> Go() {
    absl::Status s = Setup();
    if (!s.ok()) return s;
    result_.total_steps = total_steps_;
    if (result_.already_trained) {
      s = dense_->Heartbeat(clock_, /*leaving=*/true);
      if (!s.ok()) return s;
      return result_;
    }
    start_ = o_.clock->Now();
    s = Loop();
    if (s.ok()) s = WaitPushes(0);
    if (!s.ok()) {
      pushes_.clear();
      dense_->Heartbeat(clock_, /*leaving=*/true).IgnoreError();
      return s;
    }
    result_.wall_s = absl::ToDoubleSeconds(o_.clock->Now() - start_);
    result_.examples_per_s = result_.examples / std::max(result_.wall_s, 1e-9);
    s = dense_->Heartbeat(clock_, /*leaving=*/true);
    if (!s.ok()) return s;
    std::fprintf(
        o_.progress,
        "worker %d %s: steps %ld..%ld (%ld examples) in %.1f s, %.0f "
        "examples/s, refused rows %ld\n",
        o_.worker_id, result_.stopped ? "stopped early" : "done",
        static_cast<long>(result_.first_step), static_cast<long>(steps_done_),
        static_cast<long>(result_.examples), result_.wall_s,
        result_.examples_per_s, static_cast<long>(result_.refused_rows));
    std::fflush(o_.progress);
    if (o_.evaluate && !result_.stopped) {
      // The model evaluated is the one after every worker's last push.
      s = WaitForOtherWorkers(dense_, o_.final_wait, o_.clock, o_.stop,
                              *o_.logger);
      if (s.ok()) s = Evaluate(/*final=*/true);
      if (!s.ok()) return s;
    }
    return result_;
  }

 private:
  absl::Status Setup() {
    if (o_.logger == nullptr || o_.clock == nullptr || o_.batch_size < 1 ||
        o_.epochs < 1 || o_.log_every_steps < 1 ||
        o_.max_pushes_in_flight < 1 || o_.train_examples < 1 ||
        o_.test_examples < 0 || o_.embedding_dim < 1) {
      return absl::InvalidArgumentError(
          "CtrTrainerOptions: logger and clock are required; batch_size, "
          "epochs, log_every_steps, max_pushes_in_flight, train_examples and "
          "embedding_dim must be >= 1");
    }
    absl::Status s = ValidateCtrData(o_.data);
    if (!s.ok()) return s;
    absl::StatusOr<TrainingPlan> plan =
        PlanTraining(o_.train_examples, o_.num_workers, o_.worker_id,
                     o_.batch_size, o_.epochs, o_.max_steps);
    if (!plan.ok()) return plan.status();
    share_ = plan->share;
    steps_per_epoch_ = plan->steps_per_epoch;
    total_steps_ = plan->total_steps;
    fields_ = data_.fields();

    CtrModelConfig config;
    config.fields = fields_;
    config.dense_features = o_.data.dense_features;
    config.embedding_dim = o_.embedding_dim;
    config.hidden = o_.hidden;
    // Evaluation runs in larger chunks than training.
    absl::StatusOr<std::unique_ptr<CtrModel>> model =
        CtrModel::Create(config, std::max(o_.batch_size, kEvalChunk), backend_);
    if (!model.ok()) return model.status();
    model_ = *std::move(model);
    for (StepSlot& slot : slots_) {
      s = slot.params.Init(model_->params(), backend_);
      if (!s.ok()) return s;
      slot.ids.resize(fields_);
      slot.emb.resize(static_cast<size_t>(fields_) * o_.batch_size *
                      o_.embedding_dim);
    }
    s = eval_params_.Init(model_->params(), backend_);
    if (!s.ok()) return s;
    grads_.resize(o_.max_pushes_in_flight + 1);
    for (DenseSet& g : grads_) {
      s = g.Init(model_->params(), backend_);
      if (!s.ok()) return s;
    }
    emb_grads_.resize(slots_[0].emb.size());

    const std::vector<TensorSpec> dense_specs =
        CtrDenseSpecs(*model_, o_.dense_optimizer, o_.seed);
    std::vector<TableSpec> tables;
    for (int f = 0; f < fields_; ++f) {
      TableSpec t;
      t.set_name(CtrTableName(f));
      t.set_dim(o_.embedding_dim);
      t.set_init(INIT_UNIFORM);
      t.set_init_value(o_.embedding_init);
      t.set_seed(o_.seed + static_cast<uint64_t>(f));
      *t.mutable_optimizer() = o_.table_optimizer;
      tables.push_back(std::move(t));
    }
    if (o_.create) {
      s = dense_->Create(dense_specs);
      if (s.ok()) s = rows_->CreateTables(tables);
      if (!s.ok()) return s;
      o_.logger->info("created {} dense tensors and {} tables",
                      dense_specs.size(), tables.size());
    } else {
      std::vector<std::string> names;
      for (const TensorSpec& t : dense_specs) names.push_back(t.name());
      s = dense_->WaitFor(names, o_.wait_for_tables);
      names.clear();
      for (const TableSpec& t : tables) names.push_back(t.name());
      if (s.ok()) s = rows_->WaitForTables(names, o_.wait_for_tables);
      if (!s.ok()) return s;
    }
    absl::StatusOr<Registration> reg = dense_->Register();
    if (!reg.ok()) return reg.status();
    clock_ = reg->resume_clock;
    // The data position, not the clock, says where the share continues.
    const ShareStart start =
        StartShare(*reg, total_steps_, o_.worker_id, *o_.logger);
    steps_done_ = result_.first_step = start.step;
    result_.already_trained = start.already_trained;
    if (start.already_trained) return absl::OkStatus();
    if (o_.evaluate && o_.test_examples > 0) {
      test_ = data_.Generate(CtrSplit::kTest, 0, o_.test_examples);
      result_.bayes_auc = Auc(test_.probability, test_.labels);
      result_.bayes_logloss = LogLoss(test_.probability, test_.labels);
      double clicks = 0;
      for (float y : test_.labels) clicks += y;
      std::fprintf(o_.progress,
                   "test split: %ld examples, click rate %.4f, bayes-optimal "
                   "auc %.4f, log loss %.4f\n",
                   static_cast<long>(test_.size()), clicks / test_.size(),
                   result_.bayes_auc, result_.bayes_logloss);
      std::fflush(o_.progress);
    }
    o_.logger->info(
        "worker {}/{}: examples [{}, {}), {} steps of {}, {} fields, "
        "embedding dim {}, MLP input {}, backend {}",
        o_.worker_id, o_.num_workers, share_.begin, share_.end, total_steps_,
        o_.batch_size, fields_, o_.embedding_dim, model_->input_dim(),
        backend_->name());
    return absl::OkStatus();
  }

  // Set by a signal handler (TrainerOptions.stop).
  bool Stopping() const { return o_.stop != nullptr && *o_.stop; }

  // The shuffled example indices of this worker's share in `epoch`.
  const std::vector<int64_t>& Shuffled(int64_t epoch) {
    if (shuffled_epoch_ != epoch) {
      shuffled_ = EpochOrder(share_, o_.seed, o_.worker_id, epoch);
      shuffled_epoch_ = epoch;
    }
    return shuffled_;
  }

  // Generates step `step`'s minibatch into `slot` and starts pulling its
  // parameters and rows for clock `for_clock`.
  void StartStep(StepSlot* slot, int64_t step, int64_t for_clock) {
    const std::vector<int64_t>& order = Shuffled(step / steps_per_epoch_);
    const size_t at =
        static_cast<size_t>(step % steps_per_epoch_) * o_.batch_size;
    const size_t n = std::min<size_t>(o_.batch_size, order.size() - at);
    slot->step = step;
    slot->indices.assign(order.begin() + at, order.begin() + at + n);
    data_.Generate(CtrSplit::kTrain, slot->indices, &slot->examples);
    std::vector<RowsQuery> queries;
    for (int f = 0; f < fields_; ++f) {
      std::vector<uint64_t>& ids = slot->ids[f];
      ids.resize(n);
      for (size_t i = 0; i < n; ++i)
        ids[i] = slot->examples.ids[i * fields_ + f];
      queries.push_back(
          {CtrTableName(f), ids, slot->emb.data() + f * n * o_.embedding_dim});
    }
    slot->dense_pull =
        dense_->StartPull(clock_, for_clock, slot->params.pulls());
    slot->rows_pull = rows_->StartPullRows(clock_, for_clock, queries);
  }

  absl::Status Loop() {
    int cur = 0;
    if (steps_done_ < total_steps_)
      StartStep(&slots_[cur], steps_done_, clock_);
    while (steps_done_ < total_steps_) {
      StepSlot& slot = slots_[cur];
      absl::Status s = slot.dense_pull->Wait();
      if (s.ok()) s = slot.rows_pull->Wait();
      // A stop ends a pull that waits (e.g. for slower workers) at once.
      if (!s.ok() && !(Stopping() && absl::IsCancelled(s))) return s;
      result_.stopped = Stopping();
      if (result_.stopped) {
        o_.logger->info("stopping after step {} as asked", steps_done_);
        return absl::OkStatus();
      }
      const bool ahead = o_.pipeline && steps_done_ + 1 < total_steps_;
      if (ahead) StartStep(&slots_[1 - cur], steps_done_ + 1, clock_ + 1);
      s = WaitPushes(o_.max_pushes_in_flight - 1);
      if (!s.ok()) return s;
      DenseSet& grads = grads_[pushes_made_ % grads_.size()];
      const int batch = static_cast<int>(slot.indices.size());
      absl::StatusOr<double> loss = model_->ComputeGradients(
          slot.params.reads(), slot.emb.data(), slot.examples.dense.data(),
          slot.examples.labels.data(), batch, grads.writes(),
          emb_grads_.data());
      if (!loss.ok()) return loss.status();
      window_loss_ += *loss;
      ++window_steps_;
      StepPush push;
      push.dense =
          dense_->StartPush(clock_, grads.pushes(), slot.dense_pull->read());
      std::vector<RowsGrad> rows;
      for (int f = 0; f < fields_; ++f) {
        rows.push_back({CtrTableName(f), slot.ids[f],
                        emb_grads_.data() +
                            static_cast<size_t>(f) * batch * o_.embedding_dim});
      }
      push.rows = rows_->StartPushRows(clock_, rows, slot.rows_pull->read());
      push.steps_after = steps_done_ + 1;
      pushes_.push_back(std::move(push));
      ++pushes_made_;
      ++clock_;
      ++steps_done_;
      ++result_.steps;
      result_.examples += batch;
      if (steps_done_ % o_.log_every_steps == 0) Progress();
      if (o_.evaluate && o_.eval_every_steps > 0 &&
          steps_done_ % o_.eval_every_steps == 0) {
        s = Evaluate(/*final=*/false);
        if (!s.ok()) return s;
      }
      if (ahead) {
        cur = 1 - cur;
      } else if (steps_done_ < total_steps_) {
        StartStep(&slots_[cur], steps_done_, clock_);
      }
    }
    return absl::OkStatus();
  }

  // Waits for the oldest pushes until at most `keep` are in flight.
  absl::Status WaitPushes(size_t keep) {
    for (; pushes_.size() > keep; pushes_.pop_front()) {
      StepPush& push = pushes_.front();
      absl::StatusOr<PushSummary> d = push.dense->Wait();
      absl::StatusOr<PushSummary> r = push.rows->Wait();
      if (!d.ok()) return d.status();
      if (!r.ok()) return r.status();
      // In order: every step up to this one is acknowledged everywhere.
      dense_->ReportTrained(push.steps_after);
      result_.refused_rows += r->refused_stale + r->refused_restored;
      result_.rows_created += r->rows_created;
    }
    return absl::OkStatus();
  }

  void Progress() {
    const absl::Time now = o_.clock->Now();
    if (window_start_ == absl::InfinitePast()) window_start_ = start_;
    const double dt =
        std::max(absl::ToDoubleSeconds(now - window_start_), 1e-9);
    std::fprintf(o_.progress,
                 "worker %d step %ld/%ld loss %.4f examples/s %.0f refused "
                 "rows %ld\n",
                 o_.worker_id, static_cast<long>(steps_done_),
                 static_cast<long>(total_steps_),
                 window_loss_ / std::max<int64_t>(window_steps_, 1),
                 window_steps_ * o_.batch_size / dt,
                 static_cast<long>(result_.refused_rows));
    std::fflush(o_.progress);
    window_start_ = now;
    window_loss_ = 0;
    window_steps_ = 0;
  }

  // AUC and log loss of the current parameters on the test split. The rows
  // are peeked at: test ids never trained on are not created.
  absl::Status Evaluate(bool final) {
    if (test_.size() == 0) return absl::OkStatus();
    DenseSet& params = eval_params_;
    absl::Status s = dense_->StartPull(clock_, clock_, params.pulls())->Wait();
    if (!s.ok()) return s;
    std::vector<float> scores(test_.size());
    std::vector<std::vector<uint64_t>> ids(fields_);
    std::vector<float> emb;
    for (int64_t begin = 0; begin < test_.size(); begin += kEvalChunk) {
      const int n =
          static_cast<int>(std::min<int64_t>(kEvalChunk, test_.size() - begin));
      emb.resize(static_cast<size_t>(fields_) * n * o_.embedding_dim);
      std::vector<RowsQuery> queries;
      for (int f = 0; f < fields_; ++f) {
        ids[f].resize(n);
        for (int i = 0; i < n; ++i)
          ids[f][i] = test_.ids[(begin + i) * fields_ + f];
        RowsQuery q{CtrTableName(f), ids[f],
                    emb.data() + static_cast<size_t>(f) * n * o_.embedding_dim};
        q.peek = true;
        queries.push_back(std::move(q));
      }
      s = rows_->StartPullRows(clock_, clock_, queries)->Wait();
      if (!s.ok()) return s;
      s = model_->Predict(params.reads(), emb.data(),
                          test_.dense.data() + begin * test_.dense_features, n,
                          scores.data() + begin);
      if (!s.ok()) return s;
    }
    const double auc = Auc(scores, test_.labels);
    const double loss = LogLoss(scores, test_.labels);
    if (final) {
      result_.test_auc = auc;
      result_.test_logloss = loss;
      std::fprintf(o_.progress,
                   "final test log loss: %.4f (bayes-optimal %.4f)\n", loss,
                   result_.bayes_logloss);
      std::fprintf(o_.progress, "final test auc: %.4f (bayes-optimal %.4f)\n",
                   auc, result_.bayes_auc);
    } else {
      std::fprintf(o_.progress,
                   "eval step %ld wall %.1f s: test auc %.4f (bayes-optimal "
                   "%.4f) log loss %.4f\n",
                   static_cast<long>(steps_done_),
                   absl::ToDoubleSeconds(o_.clock->Now() - start_), auc,
                   result_.bayes_auc, loss);
    }
    std::fflush(o_.progress);
    return absl::OkStatus();
  }

  static constexpr int kEvalChunk = 4096;

  const CtrTrainerOptions& o_;
  ParameterStore* const dense_;
  RowStore* const rows_;
  Backend* const backend_;
  const CtrData data_;

  int fields_ = 0;
  Share share_;
  int64_t steps_per_epoch_ = 1;
  int64_t total_steps_ = 0;
  std::unique_ptr<CtrModel> model_;
  StepSlot slots_[2];
  DenseSet eval_params_;
  std::vector<DenseSet> grads_;  // one per push in flight, plus one
  std::vector<float> emb_grads_;
  std::deque<StepPush> pushes_;
  int64_t pushes_made_ = 0;
  std::vector<int64_t> shuffled_;
  int64_t shuffled_epoch_ = -1;
  CtrExamples test_;
  absl::Time start_;
  absl::Time window_start_ = absl::InfinitePast();
  int64_t clock_ = 0;
  int64_t steps_done_ = 0;
  CtrResult result_;
  double window_loss_ = 0;
  int64_t window_steps_ = 0;
};

}  // namespace

absl::StatusOr<CtrResult> TrainCtr(const CtrTrainerOptions& options,
                                   ParameterStore* dense, RowStore* rows,
                                   Backend* backend) {
  CtrRun run(options, dense, rows, backend);
  return run.Go();
}

}  // namespace asyncps
