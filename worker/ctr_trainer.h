#ifndef ASYNCPS_WORKER_CTR_TRAINER_H_
#define ASYNCPS_WORKER_CTR_TRAINER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "proto/asyncps.pb.h"
#include "worker/ctr_data.h"
#include "worker/parameter_store.h"
#include "worker/training_loop.h"

namespace asyncps {

// The click model's loop: LoopOptions (worker/training_loop.h), with
// defaults of its own, and the model's options.
struct CtrTrainerOptions : LoopOptions {
  CtrTrainerOptions() {
    batch_size = 256;
    epochs = 1;
    max_pushes_in_flight = 2;
    eval_every_steps = -1;  // at the end only
    log_every_steps = 200;
  }
  // The synthetic click log (worker/ctr_data.h) and the size of its splits.
  CtrDataOptions data;
  int64_t train_examples = 8000000;
  int64_t test_examples = 200000;
  // The model (models/ctr_model.h): one table of embedding_dim per field.
  int embedding_dim = 16;
  std::vector<int> hidden = {64, 32};
  OptimizerSpec dense_optimizer;  // the MLP, on the shards
  OptimizerSpec table_optimizer;  // the embedding rows, on the shards
  float embedding_init = 0.01f;   // rows start U(-init, init)
  // Admission and eviction of every table's rows: the fields set here
  // (TableSpec admission, admit_*, eviction, lfu_half_life_steps) are
  // merged into each table's spec.
  TableSpec table_policy;
};

struct CtrResult : LoopResult {
  int64_t refused_rows = 0;  // row updates refused (stale or restored)
  // Rows this worker's pulls (without admission) and pushes (with it)
  // created on the shards.
  int64_t rows_created = 0;
  double test_auc = -1;   // -1 when this worker does not evaluate
  double bayes_auc = -1;  // of the hidden model's probabilities
  double test_logloss = 0;
  double bayes_logloss = 0;
};

// Trains the CTR model with asynchronous SGD through RunTrainingLoop
// (worker/training_loop.h): every step pulls the MLP's dense tensors and
// the rows of its minibatch's ids (one table per field) in one pull,
// computes the gradients on `backend` and pushes both in one push (one
// request per shard, applied whole or not at all), tagged with what it read
// and the worker's clock. The evaluating worker waits for the others, then
// prints "final test auc: 0.XXXX (bayes-optimal 0.XXXX)" for the test
// split, whose rows it reads without creating them.
//
// `store` and `backend` are not owned.
absl::StatusOr<CtrResult> TrainCtr(const CtrTrainerOptions& options,
                                   ParameterStore* store, Backend* backend);

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_CTR_TRAINER_H_
