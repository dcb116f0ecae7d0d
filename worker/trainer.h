#ifndef ASYNCPS_WORKER_TRAINER_H_
#define ASYNCPS_WORKER_TRAINER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "data/idx_reader.h"
#include "kernels/backend.h"
#include "proto/asyncps.pb.h"
#include "worker/parameter_store.h"
#include "worker/training_loop.h"

namespace asyncps {

// The MLP's loop: LoopOptions (worker/training_loop.h) and the model's own.
struct TrainerOptions : LoopOptions {
  std::vector<int> layer_sizes = {784, 256, 128, 10};
  OptimizerSpec optimizer;
  // Compute this many steps locally (plain SGD on a local copy, at the
  // optimizer's learning rate) and push the sum of their gradients once:
  // fewer messages, staler updates. 1 = push every step. A clock tick is
  // one push.
  int push_every = 1;
  // Sleep this long every step: makes a worker a straggler for experiments.
  absl::Duration straggler_delay = absl::ZeroDuration();
  // Transient delays for experiments: each step, with probability
  // delay_spike_prob, sleep delay_spike (drawn from a generator seeded by
  // seed and worker_id, so runs repeat).
  absl::Duration delay_spike = absl::ZeroDuration();
  double delay_spike_prob = 0;
  // If set (and evaluating), one CSV row per evaluation: wall_s,step,epoch,
  // test_accuracy,test_loss,refused,mean_staleness,max_staleness.
  std::string eval_csv;
};

struct TrainResult : LoopResult {
  int64_t refused_slices = 0;  // slice updates refused (stale or restored)
  int64_t applied_slices = 0;
  double mean_staleness = 0;  // over this worker's applied/refused slices
  uint64_t max_staleness = 0;
  double final_accuracy = -1;  // -1 when this worker does not evaluate
  double final_loss = 0;
};

// Trains an MLP with asynchronous SGD through RunTrainingLoop
// (worker/training_loop.h): every round pulls the parameters, computes the
// gradient of push_every minibatches of this worker's share of `train` on
// `backend`, and pushes it with the versions read and the worker's clock.
// Slices refused as too stale are dropped (the next round pulls fresh
// parameters). Evaluates every eval_every_steps (0: once per epoch of the
// share) and, when evaluating, prints "final test accuracy: 0.XXXX" at the
// end.
//
// `store` and `backend` are not owned.
absl::StatusOr<TrainResult> Train(const TrainerOptions& options,
                                  const Dataset& train, const Dataset& test,
                                  ParameterStore* store, Backend* backend);

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_TRAINER_H_
