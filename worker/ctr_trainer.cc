#include "worker/ctr_trainer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/ctr_model.h"

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

// One step's minibatch and the parameters pulled for it (a read set).
struct StepSlot {
  CtrExamples examples;
  std::vector<std::vector<uint64_t>> ids;  // per field: the batch's ids
  std::vector<float> emb;                  // fields x batch x dim
  DenseSet params;
  std::unique_ptr<ParameterStore::PendingPull> pull;  // tensors and rows
};

// A gradient set and its push in flight (tensors and rows in one).
struct GradSlot {
  DenseSet grads;
  std::unique_ptr<ParameterStore::PendingPush> push;
};

class CtrModelRun : public TrainingModel {
 public:
  CtrModelRun(const CtrTrainerOptions& o, ParameterStore* store,
              Backend* backend, CtrResult* result)
      : o_(o),
        store_(store),
        backend_(backend),
        result_(result),
        data_(o.data) {}

  absl::Status Setup(const TrainingPlan& plan, int read_sets,
                     int grad_sets) override {
    if (o_.train_examples < 1 || o_.test_examples < 0 || o_.embedding_dim < 1) {
      return absl::InvalidArgumentError(
          "CtrTrainerOptions: train_examples and embedding_dim must be >= 1, "
          "test_examples >= 0");
    }
    absl::Status s = ValidateCtrData(o_.data);
    if (!s.ok()) return s;
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
    slots_ = std::vector<StepSlot>(read_sets);
    for (StepSlot& slot : slots_) {
      s = slot.params.Init(model_->params(), backend_);
      if (!s.ok()) return s;
      slot.ids.resize(fields_);
      slot.emb.resize(static_cast<size_t>(fields_) * o_.batch_size *
                      o_.embedding_dim);
    }
    s = eval_params_.Init(model_->params(), backend_);
    if (!s.ok()) return s;
    grads_ = std::vector<GradSlot>(grad_sets);
    for (GradSlot& g : grads_) {
      s = g.grads.Init(model_->params(), backend_);
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
      t.MergeFrom(o_.table_policy);
      tables.push_back(std::move(t));
    }
    if (o_.create) {
      s = store_->Create(dense_specs, tables);
      if (!s.ok()) return s;
      o_.logger->info("created {} dense tensors and {} tables",
                      dense_specs.size(), tables.size());
      return absl::OkStatus();
    }
    std::vector<std::string> names;
    for (const TensorSpec& t : dense_specs) names.push_back(t.name());
    for (const TableSpec& t : tables) names.push_back(t.name());
    return store_->WaitFor(names, o_.wait_for_tensors);
  }

  absl::Status Begin(const TrainingPlan& plan) override {
    if (o_.evaluate && o_.test_examples > 0) {
      test_ = data_.Generate(CtrSplit::kTest, 0, o_.test_examples);
      result_->bayes_auc = Auc(test_.probability, test_.labels);
      result_->bayes_logloss = LogLoss(test_.probability, test_.labels);
      double clicks = 0;
      for (float y : test_.labels) clicks += y;
      std::fprintf(o_.progress,
                   "test split: %ld examples, click rate %.4f, bayes-optimal "
                   "auc %.4f, log loss %.4f\n",
                   static_cast<long>(test_.size()), clicks / test_.size(),
                   result_->bayes_auc, result_->bayes_logloss);
      std::fflush(o_.progress);
    }
    o_.logger->info(
        "worker {}/{}: examples [{}, {}), {} steps of {}, {} fields, "
        "embedding dim {}, MLP input {}, backend {}",
        o_.worker_id, o_.num_workers, plan.share.begin, plan.share.end,
        plan.total_steps, o_.batch_size, fields_, o_.embedding_dim,
        model_->input_dim(), backend_->name());
    return absl::OkStatus();
  }

  // Generates the step's minibatch into the slot and starts pulling its
  // parameters and rows: one request per shard.
  void StartRead(int set, int64_t step, absl::Span<const int64_t> examples,
                 int64_t clock, int64_t for_clock) override {
    StepSlot& slot = slots_[set];
    const size_t n = examples.size();
    data_.Generate(CtrSplit::kTrain, examples, &slot.examples);
    PullSet what;
    what.tensors = slot.params.pulls();
    for (int f = 0; f < fields_; ++f) {
      std::vector<uint64_t>& ids = slot.ids[f];
      ids.resize(n);
      for (size_t i = 0; i < n; ++i) {
        ids[i] = slot.examples.ids[i * fields_ + f];
      }
      what.rows.push_back(
          {CtrTableName(f), ids, slot.emb.data() + f * n * o_.embedding_dim});
    }
    slot.pull = store_->StartPull(clock, for_clock, what);
  }

  absl::Status WaitRead(int set) override {
    StorePull& pull = *slots_[set].pull;
    absl::Status s = pull.Wait();
    if (s.ok()) result_->rows_created += pull.rows_created();
    return s;
  }

  absl::Status Step(int set, int grads, int64_t j, int64_t round,
                    absl::Span<const int64_t> examples) override {
    StepSlot& slot = slots_[set];
    absl::StatusOr<double> loss = model_->ComputeGradients(
        slot.params.reads(), slot.emb.data(), slot.examples.dense.data(),
        slot.examples.labels.data(), static_cast<int>(examples.size()),
        grads_[grads].grads.writes(), emb_grads_.data());
    if (!loss.ok()) return loss.status();
    window_loss_ += *loss;
    ++window_steps_;
    return absl::OkStatus();
  }

  void StartPush(int set, int grads, int64_t clock) override {
    StepSlot& slot = slots_[set];
    GradSlot& g = grads_[grads];
    const size_t batch = slot.ids.empty() ? 0 : slot.ids[0].size();
    PushSet what;
    what.tensors = g.grads.pushes();
    for (int f = 0; f < fields_; ++f) {
      what.rows.push_back({CtrTableName(f), slot.ids[f],
                           emb_grads_.data() + static_cast<size_t>(f) * batch *
                                                   o_.embedding_dim});
    }
    g.push = store_->StartPush(clock, what, slot.pull->read());
  }

  absl::Status WaitPush(int grads) override {
    GradSlot& g = grads_[grads];
    absl::StatusOr<PushSummary> done = g.push->Wait();
    g.push.reset();
    if (!done.ok()) return done.status();
    result_->refused_rows +=
        done->rows.refused_stale + done->rows.refused_restored;
    result_->rows_created += done->rows_created;
    return absl::OkStatus();
  }

  void DropPushes() override {
    for (GradSlot& g : grads_) g.push.reset();  // each waits for its own end
  }

  // AUC and log loss of the current parameters on the test split. The rows
  // are peeked at: test ids never trained on are not created.
  absl::Status Evaluate(int set, bool final, const LoopPosition& at) override {
    if (test_.size() == 0) return absl::OkStatus();
    DenseSet& params = eval_params_;
    absl::Status s =
        store_->StartPull(at.clock, at.clock, PullSet{params.pulls(), {}})
            ->Wait();
    if (!s.ok()) return s;
    std::vector<float> scores(test_.size());
    std::vector<std::vector<uint64_t>> ids(fields_);
    std::vector<float> emb;
    for (int64_t begin = 0; begin < test_.size(); begin += kEvalChunk) {
      const int n =
          static_cast<int>(std::min<int64_t>(kEvalChunk, test_.size() - begin));
      emb.resize(static_cast<size_t>(fields_) * n * o_.embedding_dim);
      PullSet queries;
      for (int f = 0; f < fields_; ++f) {
        ids[f].resize(n);
        for (int i = 0; i < n; ++i)
          ids[f][i] = test_.ids[(begin + i) * fields_ + f];
        RowsQuery q{CtrTableName(f), ids[f],
                    emb.data() + static_cast<size_t>(f) * n * o_.embedding_dim};
        q.peek = true;
        queries.rows.push_back(std::move(q));
      }
      s = store_->StartPull(at.clock, at.clock, queries)->Wait();
      if (!s.ok()) return s;
      s = model_->Predict(params.reads(), emb.data(),
                          test_.dense.data() + begin * test_.dense_features, n,
                          scores.data() + begin);
      if (!s.ok()) return s;
    }
    const double auc = Auc(scores, test_.labels);
    const double loss = LogLoss(scores, test_.labels);
    if (final) {
      result_->test_auc = auc;
      result_->test_logloss = loss;
      std::fprintf(o_.progress,
                   "final test log loss: %.4f (bayes-optimal %.4f)\n", loss,
                   result_->bayes_logloss);
      std::fprintf(o_.progress, "final test auc: %.4f (bayes-optimal %.4f)\n",
                   auc, result_->bayes_auc);
    } else {
      std::fprintf(o_.progress,
                   "eval step %ld wall %.1f s: test auc %.4f (bayes-optimal "
                   "%.4f) log loss %.4f\n",
                   static_cast<long>(at.step), at.wall_s, auc,
                   result_->bayes_auc, loss);
    }
    std::fflush(o_.progress);
    return absl::OkStatus();
  }

  void Progress(const LoopPosition& at) override {
    std::fprintf(o_.progress,
                 "%s worker %d step %ld/%ld loss %.4f examples/s %.0f refused "
                 "rows %ld ETA %s\n",
                 at.timestamp.c_str(), o_.worker_id, static_cast<long>(at.step),
                 static_cast<long>(at.total_steps),
                 window_loss_ / std::max<int64_t>(window_steps_, 1),
                 at.window_examples / at.window_s,
                 static_cast<long>(result_->refused_rows), at.eta.c_str());
    std::fflush(o_.progress);
    window_loss_ = 0;
    window_steps_ = 0;
  }

  std::string Summary() const override {
    return absl::StrFormat("refused rows %d, rows created %d",
                           result_->refused_rows, result_->rows_created);
  }

 private:
  static constexpr int kEvalChunk = 4096;

  const CtrTrainerOptions& o_;
  ParameterStore* const store_;
  Backend* const backend_;
  CtrResult* const result_;
  const CtrData data_;

  int fields_ = 0;
  std::unique_ptr<CtrModel> model_;
  std::vector<StepSlot> slots_;  // the read sets
  DenseSet eval_params_;
  std::vector<GradSlot> grads_;
  // The rows' gradients of the latest step (read only while its push
  // starts).
  std::vector<float> emb_grads_;
  CtrExamples test_;
  double window_loss_ = 0;
  int64_t window_steps_ = 0;
};

}  // namespace

absl::StatusOr<CtrResult> TrainCtr(const CtrTrainerOptions& options,
                                   ParameterStore* store, Backend* backend) {
  CtrResult result;
  CtrModelRun model(options, store, backend, &result);
  absl::StatusOr<LoopResult> loop = RunTrainingLoop(
      options, options.train_examples, /*push_every=*/1, store, &model);
  if (!loop.ok()) return loop.status();
  static_cast<LoopResult&>(result) = *loop;
  return result;
}

}  // namespace asyncps
