#ifndef ASYNCPS_SERVING_BATCHER_H_
#define ASYNCPS_SERVING_BATCHER_H_

// The dynamic batcher: requests (each one or more feature rows) wait in a
// bounded queue; a batch thread takes the queued requests once they fill a
// batch (max_batch_rows) or the oldest has waited the policy's timeout
// (batch_policy.h), computes them together on one snapshot and answers
// each with its own rows. A request whose deadline passed before its batch
// starts is answered DEADLINE_EXCEEDED and never computed. Requests are
// validated before they are queued, so one bad request never fails its
// batch-mates.
//
// Example:
//
//   BatcherOptions options;
//   options.input_dim = 784;
//   options.output_dim = 10;
//   options.auto_timeout = true;  // the wait chosen from measurements
//   absl::StatusOr<std::unique_ptr<Batcher>> batcher = Batcher::Create(
//       options,
//       []() -> absl::StatusOr<std::unique_ptr<BatchRunner>> {
//         return MlpRunner::Create({784, 256, 10}, 64, "cpu");  // each thread
//       },
//       &snapshots, &metrics);  // a SnapshotKeeper and ServingMetrics
//   if (!batcher.ok()) return batcher.status();
//   (*batcher)->Submit(std::move(x), /*rows=*/2,
//                      absl::Now() + absl::Milliseconds(100),
//                      [](absl::StatusOr<InferResult> r) {
//                        // r->out: 2 x 10 outputs; r->snapshot: the
//                        // parameters that computed them.
//                      });

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "serving/batch_policy.h"
#include "serving/serving_metrics.h"
#include "serving/snapshot.h"

namespace asyncps {

// A model instance of one batch thread. Not thread-safe.
class BatchRunner {
 public:
  virtual ~BatchRunner() = default;
  // Computes `rows` rows with `snapshot`'s parameters into out (rows x
  // output width): x holds rows x input width features, ids rows x
  // ids_per_row categorical ids (none for a model without them).
  virtual absl::Status Run(const Snapshot& snapshot, const float* x,
                           const uint64_t* ids, int rows, float* out) = 0;
};

// The answer to one request.
struct InferResult {
  std::vector<float> out;                    // rows x output_dim
  std::shared_ptr<const Snapshot> snapshot;  // what computed it
  int batch_rows = 0;                        // rows of its batch
};

struct BatcherOptions {
  int input_dim = 0;    // features per row
  int ids_per_row = 0;  // categorical ids per row (0: none)
  int output_dim = 0;
  int max_batch_rows = 64;  // >= 1; also the largest request
  int max_queue = 1024;     // requests waiting; more: RESOURCE_EXHAUSTED
  int threads = 1;          // batch threads, each with its own runner
  bool auto_timeout = false;
  absl::Duration timeout;            // fixed wait (when !auto_timeout)
  absl::Duration latency_objective;  // for auto (0 = none)
};

class Batcher {
 public:
  using Done = std::function<void(absl::StatusOr<InferResult>)>;
  using RunnerFactory =
      std::function<absl::StatusOr<std::unique_ptr<BatchRunner>>()>;

  // Makes one runner per thread (INVALID_ARGUMENT for bad options; the
  // factory's error) and starts the threads. `snapshots` and `metrics` are
  // not owned and must outlive the batcher.
  static absl::StatusOr<std::unique_ptr<Batcher>> Create(
      const BatcherOptions& options, const RunnerFactory& factory,
      const SnapshotKeeper* snapshots, ServingMetrics* metrics);

  ~Batcher();  // Stop()
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // Queues `rows` rows (x holds rows x input_dim floats, ids rows x
  // ids_per_row ids, already validated). `done` is called exactly once, on
  // a batch thread or inline: with the result, or INVALID_ARGUMENT (rows
  // outside [1, max_batch_rows] or wrong x or ids sizes),
  // RESOURCE_EXHAUSTED (max_queue requests already wait), UNAVAILABLE (no
  // snapshot yet, or stopping), DEADLINE_EXCEEDED (`deadline` passed before
  // its batch started), or the runner's error.
  void Submit(std::vector<float> x, std::vector<uint64_t> ids, int rows,
              absl::Time deadline, Done done);
  // For models without ids.
  void Submit(std::vector<float> x, int rows, absl::Time deadline, Done done) {
    Submit(std::move(x), {}, rows, deadline, std::move(done));
  }

  // Answers every queued request UNAVAILABLE and joins the threads.
  // Idempotent.
  void Stop();

  const BatchPolicy& policy() const { return policy_; }
  int queued() const;

 private:
  struct Request {
    std::vector<float> x;
    std::vector<uint64_t> ids;
    int rows = 0;
    absl::Time arrived;
    absl::Time deadline;
    Done done;
  };

  Batcher(const BatcherOptions& options, const SnapshotKeeper* snapshots,
          ServingMetrics* metrics);
  void Loop(BatchRunner* runner);
  // Takes the next batch off the queue; empty when stopping.
  std::vector<Request> NextBatch();
  void RunBatch(BatchRunner* runner, std::vector<Request> batch);

  const BatcherOptions options_;
  const SnapshotKeeper* const snapshots_;
  ServingMetrics* const metrics_;
  BatchPolicy policy_;
  std::vector<std::unique_ptr<BatchRunner>> runners_;
  std::vector<std::thread> threads_;

  mutable absl::Mutex mu_;
  std::deque<Request> queue_ ABSL_GUARDED_BY(mu_);
  int queued_rows_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVING_BATCHER_H_
