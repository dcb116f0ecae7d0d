#ifndef ASYNCPS_WORKER_CTR_TRAINER_H_
#define ASYNCPS_WORKER_CTR_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "kernels/backend.h"
#include "proto/asyncps.pb.h"
#include "spdlog/spdlog.h"
#include "worker/ctr_data.h"
#include "worker/parameter_store.h"
#include "worker/row_store.h"

namespace asyncps {

struct CtrTrainerOptions {
  int worker_id = 0;
  int num_workers = 1;
  // The synthetic click log (worker/ctr_data.h) and the size of its splits.
  CtrDataOptions data;
  int64_t train_examples = 8000000;
  int64_t test_examples = 200000;
  // The model (worker/ctr_model.h): one table of embedding_dim per field.
  int embedding_dim = 16;
  std::vector<int> hidden = {64, 32};
  int batch_size = 256;
  int64_t epochs = 1;
  int64_t max_steps = 0;  // > 0: stop after this many steps of this worker
  OptimizerSpec dense_optimizer;  // the MLP, on the shards
  OptimizerSpec table_optimizer;  // the embedding rows, on the shards
  float embedding_init = 0.01f;   // rows start U(-init, init)
  uint64_t seed = 1;              // initial weights and shuffling
  // The creating worker creates the tensors and tables; the others wait.
  bool create = true;
  absl::Duration wait_for_tables = absl::Minutes(2);
  // The pulls for the next step (its dense parameters and its rows, whose
  // ids are known ahead) are in flight while this step computes; pushes are
  // answered while the next steps run.
  bool pipeline = true;
  int max_pushes_in_flight = 2;
  // Evaluate on the test set every this many steps (0 = at the end only),
  // and at the end. Usually worker 0 only.
  bool evaluate = true;
  int64_t eval_every_steps = 0;
  int64_t log_every_steps = 200;
  // Before the final evaluation, wait this long at most for the others.
  absl::Duration final_wait = absl::Minutes(10);
  // Set (by a signal handler) to stop after the current step. Not owned.
  const std::atomic<bool>* stop = nullptr;
  std::FILE* progress = stdout;            // not owned
  Clock* clock = Clock::Real();            // not owned
  std::shared_ptr<spdlog::logger> logger;  // required
};

struct CtrResult {
  int64_t first_step = 0;
  int64_t steps = 0;  // this process
  int64_t examples = 0;
  double wall_s = 0;
  double examples_per_s = 0;
  int64_t refused_rows = 0;  // row updates refused (stale or restored)
  int64_t rows_created = 0;  // rows this worker's pushes created
  double test_auc = -1;      // -1 when this worker does not evaluate
  double bayes_auc = -1;     // of the hidden model's probabilities
  double test_logloss = 0;
  double bayes_logloss = 0;
  bool stopped = false;
  // As TrainResult::already_trained: an earlier process of this worker id
  // trained the whole share; nothing was trained.
  bool already_trained = false;
  int64_t total_steps = 0;
};

// Trains the CTR model with asynchronous SGD: every step pulls the MLP's
// dense tensors and the rows of its minibatch's ids (one table per field),
// computes the gradients on `backend` and pushes both, tagged with what it
// read and the worker's clock. The evaluating worker waits for the others,
// then prints "final test auc: 0.XXXX (bayes-optimal 0.XXXX)" for the
// test split, whose rows it reads without creating them. The data position
// is tracked and resumed as Train (worker/trainer.h) does.
//
// `dense`, `rows` and `backend` are not owned.
absl::StatusOr<CtrResult> TrainCtr(const CtrTrainerOptions& options,
                                   ParameterStore* dense, RowStore* rows,
                                   Backend* backend);

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_CTR_TRAINER_H_
