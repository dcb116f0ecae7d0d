#ifndef ASYNCPS_WORKER_TRAINER_H_
#define ASYNCPS_WORKER_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "kernels/backend.h"
#include "proto/asyncps.pb.h"
#include "spdlog/spdlog.h"
#include "worker/idx_reader.h"
#include "worker/parameter_store.h"

namespace asyncps {

struct TrainerOptions {
  int worker_id = 0;
  int num_workers = 1;
  std::vector<int> layer_sizes = {784, 256, 128, 10};
  int batch_size = 64;
  int64_t epochs = 10;
  int64_t max_steps = 0;  // > 0: stop after this many steps of this worker
  OptimizerSpec optimizer;
  uint64_t seed = 1;  // initial weights and shuffling
  // The creating worker creates the tensors; the others wait for them.
  bool create_tensors = true;
  // How long the others wait for them (saying so every few seconds).
  absl::Duration wait_for_tensors = absl::Minutes(2);
  // Overlap communication with computation: the pull for the next step is
  // in flight while this step computes (it may then miss this worker's own
  // latest push; SSP/BSP bounds still hold, as the pull waits for the step
  // it is for), and pushes are sent while the next step runs.
  bool pipeline = true;
  // Pushes in flight at most (>= 1); more wait for the oldest.
  int max_pushes_in_flight = 1;
  // Compute this many steps locally (plain SGD on a local copy, at the
  // optimizer's learning rate) and push the sum of their gradients once:
  // fewer messages, staler updates. 1 = push every step. A clock tick is
  // one push.
  int push_every = 1;
  // Evaluate on the test set every this many steps (0 = once per epoch of
  // this worker's share) and at the end. Usually worker 0 only.
  bool evaluate = true;
  int64_t eval_every_steps = 0;
  int64_t log_every_steps = 100;
  // Sleep this long every step: makes a worker a straggler for experiments.
  absl::Duration straggler_delay = absl::ZeroDuration();
  // Transient delays for experiments: each step, with probability
  // delay_spike_prob, sleep delay_spike (drawn from a generator seeded by
  // seed and worker_id, so runs repeat).
  absl::Duration delay_spike = absl::ZeroDuration();
  double delay_spike_prob = 0;
  // Before the final evaluation, wait this long at most for the other
  // workers to finish.
  absl::Duration final_wait = absl::Minutes(10);
  // If set (and evaluating), one CSV row per evaluation: wall_s,step,epoch,
  // test_accuracy,test_loss,refused,mean_staleness,max_staleness.
  std::string eval_csv;
  // Set (by a signal handler) to stop after the current step: pushes in
  // flight finish, the worker leaves, Train returns with stopped = true.
  // Not owned; may be null.
  const std::atomic<bool>* stop = nullptr;
  std::FILE* progress = stdout;  // human-readable progress lines; not owned
  Clock* clock = Clock::Real();  // not owned
  std::shared_ptr<spdlog::logger> logger;  // required
};

struct TrainResult {
  int64_t first_step = 0;  // > 0 when a restarted worker resumed
  int64_t steps = 0;       // steps this process ran
  int64_t examples = 0;
  double wall_s = 0;
  double examples_per_s = 0;
  int64_t refused_slices = 0;  // slice updates refused (stale or restored)
  int64_t applied_slices = 0;
  double mean_staleness = 0;  // over this worker's applied/refused slices
  uint64_t max_staleness = 0;
  double final_accuracy = -1;  // -1 when this worker does not evaluate
  double final_loss = 0;
  bool stopped = false;  // by options.stop, before the last step
  // An earlier process of this worker id trained the whole share already
  // (the shards' data position): nothing was trained; not an error, but
  // not a success either (a rerun of a finished run).
  bool already_trained = false;
  int64_t total_steps = 0;  // of this worker's share
};

// The parameter tensors of the model: glorot-uniform weights, zero biases,
// all with `optimizer` and `seed`.
std::vector<TensorSpec> ModelSpecs(const std::vector<int>& layer_sizes,
                                   const OptimizerSpec& optimizer,
                                   uint64_t seed);

// Trains an MLP with asynchronous SGD: every step pulls the parameters,
// computes the gradient of one minibatch of this worker's share of `train`
// on `backend`, and pushes it with the versions read and the worker's clock
// (pipelined as TrainerOptions says). Slices refused as too stale are
// dropped (the next step pulls fresh parameters). The data position (steps
// of the share whose pushes every shard acknowledged) is reported to the
// shards as it advances; a process that replaces an earlier one of its
// worker id continues its share at the position the shards recorded
// (Registration.trained), whatever clock it joins at. Prints a progress
// line every log_every_steps and, when evaluating, "final test accuracy:
// 0.XXXX" at the end.
//
// `store` and `backend` are not owned.
absl::StatusOr<TrainResult> Train(const TrainerOptions& options,
                                  const Dataset& train, const Dataset& test,
                                  ParameterStore* store, Backend* backend);

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_TRAINER_H_
