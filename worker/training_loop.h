#ifndef ASYNCPS_WORKER_TRAINING_LOOP_H_
#define ASYNCPS_WORKER_TRAINING_LOOP_H_

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "spdlog/spdlog.h"
#include "worker/parameter_store.h"
#include "worker/partition.h"

namespace asyncps {

// What every asynchronous training loop is told, whatever its model
// (TrainerOptions and CtrTrainerOptions extend it).
struct LoopOptions {
  int worker_id = 0;
  int num_workers = 1;
  int batch_size = 64;
  int64_t epochs = 10;
  int64_t max_steps = 0;  // > 0: stop after this many steps of this worker
  uint64_t seed = 1;      // initial values and shuffling
  // The creating worker creates the tensors (and tables); the others wait
  // this long for them (saying so every few seconds).
  bool create = true;
  absl::Duration wait_for_tensors = absl::Minutes(2);
  // Overlap communication with computation: the read for the next round is
  // in flight while this round computes (it may then miss this worker's own
  // latest push; SSP/BSP bounds still hold, as the read waits for the clock
  // it is for), and pushes are answered while the next rounds run.
  bool pipeline = true;
  // Pushes in flight at most (>= 1); more wait for the oldest.
  int max_pushes_in_flight = 1;
  // Evaluate on the test set every this many steps (0: once per epoch of
  // this worker's share; < 0: never during training) and at the end.
  // Usually worker 0 only.
  bool evaluate = true;
  int64_t eval_every_steps = 0;
  int64_t log_every_steps = 100;
  // Before the final evaluation, wait this long at most for the other
  // workers to finish.
  absl::Duration final_wait = absl::Minutes(10);
  // Set (by a signal handler) to stop after the current round: pushes in
  // flight finish, the worker leaves, the loop returns with stopped = true.
  // Not owned; may be null.
  const std::atomic<bool>* stop = nullptr;
  std::FILE* progress = stdout;            // progress lines; not owned
  Clock* clock = Clock::Real();            // not owned
  std::shared_ptr<spdlog::logger> logger;  // required
};

// What every training loop reports (TrainResult and CtrResult extend it).
struct LoopResult {
  int64_t first_step = 0;  // > 0 when a restarted worker resumed
  int64_t steps = 0;       // steps this process ran
  int64_t examples = 0;
  double wall_s = 0;
  double examples_per_s = 0;
  bool stopped = false;  // by LoopOptions::stop, before the last step
  // An earlier process of this worker id trained the whole share already
  // (the shards' data position): nothing was trained; not an error, but
  // not a success either (a rerun of a finished run).
  bool already_trained = false;
  int64_t total_steps = 0;  // of this worker's share
};

// Where the loop stands, for a model's progress lines and evaluations.
struct LoopPosition {
  int64_t step = 0;   // steps computed (their pushes may be in flight)
  int64_t clock = 0;  // the worker's clock: of its next push
  int64_t total_steps = 0;
  int64_t steps_per_epoch = 1;
  double wall_s = 0;  // since the first step
  // Since the last progress line: seconds, steps and their examples.
  double window_s = 0;
  int64_t window_steps = 0;
  int64_t window_examples = 0;
  std::string timestamp;  // local time, "YYYY-MM-DD HH:MM:SS"
  std::string eta;        // of the share at the window's rate, e.g. "3m07s"
};

// The model's half of a training loop: its buffers, reads, steps, pushes
// and evaluations. The loop (RunTrainingLoop) owns the order: which read
// set a round's parameters go to (two, so that the next round's read is in
// flight while this one computes), which gradient set a round writes (one
// per push in flight plus one; a set is reused only after its push was
// waited for), the clocks, the data position and leaving the cluster.
class TrainingModel {
 public:
  virtual ~TrainingModel() = default;

  // Builds the model and `read_sets` + `grad_sets` buffer sets, and creates
  // (LoopOptions::create) or waits for the tensors on the shards.
  virtual absl::Status Setup(const TrainingPlan& plan, int read_sets,
                             int grad_sets) = 0;
  // Before the first step of this process (not called when the share was
  // already trained): what costs time or writes files only for a real run.
  virtual absl::Status Begin(const TrainingPlan& plan) = 0;

  // Starts reading the parameters of the round that begins with `step`
  // (whose examples are `examples`, valid during the call) into read set
  // `set`, as `clock` and waiting (SSP/BSP) until clock `for_clock` may be
  // read.
  virtual void StartRead(int set, int64_t step,
                         absl::Span<const int64_t> examples, int64_t clock,
                         int64_t for_clock) = 0;
  // Waits for read set `set`'s read.
  virtual absl::Status WaitRead(int set) = 0;
  // Step `j` of a round of `round` steps: the gradient of `examples` at the
  // parameters in read set `set`, into gradient set `grads` (a round of
  // several steps pushes their sum; see TrainerOptions::push_every).
  virtual absl::Status Step(int set, int grads, int64_t j, int64_t round,
                            absl::Span<const int64_t> examples) = 0;
  // Starts pushing gradient set `grads` as `clock`, tagged with what read
  // set `set` read.
  virtual void StartPush(int set, int grads, int64_t clock) = 0;
  // StartPush(set, grads, clock), then StartRead(set, step, examples,
  // clock + 1, clock + 1) once the push is started; a model whose read
  // does not depend on the examples sends both as one step
  // (ParameterStore::StartStep), the read served after the push.
  virtual void StartPushThenRead(int set, int grads, int64_t clock,
                                 int64_t step,
                                 absl::Span<const int64_t> examples) {
    StartPush(set, grads, clock);
    StartRead(set, step, examples, clock + 1, clock + 1);
  }
  // Waits for the push of gradient set `grads` and tallies its outcome.
  virtual absl::Status WaitPush(int grads) = 0;
  // Forgets the pushes in flight (each waits for its own end): a failed run.
  virtual void DropPushes() = 0;

  // An evaluation during training (after `at.step`; read set `set` holds
  // the parameters the last step used) or, when `final`, after every
  // worker finished.
  virtual absl::Status Evaluate(int set, bool final,
                                const LoopPosition& at) = 0;
  // Every LoopOptions::log_every_steps: one progress line.
  virtual void Progress(const LoopPosition& at) = 0;
  // The end of the "worker N done: ..." line: the model's tallies.
  virtual std::string Summary() const = 0;
};

// Trains `model` on `num_examples` examples with asynchronous SGD: plans
// this worker's share (worker/partition.h), sets the model up, registers
// with `store` and continues the share at the data position the shards
// recorded (a share already trained returns at once, already_trained set).
// Every round waits for its read, computes `push_every` steps (starting the
// next round's read before the last one when pipelining) and starts one
// push; pushes are waited for in order, each reporting the steps up to it
// as trained. The worker leaves when done (also when it fails or stops);
// when evaluating and not stopped, it waits for the other workers and the
// model evaluates the final parameters. Prints progress lines and "<time>
// worker N done: steps A..B (E examples) in S s, R examples/s, <Summary>"
// to LoopOptions::progress.
//
// `store` and `model` are not owned.
absl::StatusOr<LoopResult> RunTrainingLoop(const LoopOptions& options,
                                           int64_t num_examples, int push_every,
                                           ParameterStore* store,
                                           TrainingModel* model);

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_TRAINING_LOOP_H_
