#ifndef ASYNCPS_SERVING_BATCH_POLICY_H_
#define ASYNCPS_SERVING_BATCH_POLICY_H_

// How long a batch waits for more requests before it runs.
//
// Fixed: the operator's --batch_timeout_us. Auto: chosen continuously from
// two measurements, the arrival rate (rows per second over 100 ms windows,
// smoothed) and a batch thread's time per batch (computing and answering)
// as a function of the batch size, c(b) = a + s * b (a least-squares fit
// over recent batches, older ones decaying), and recomputed once per rate
// window. For a candidate wait T the policy predicts, with k batch threads
// and batches of at most B rows:
//
//   rows per batch   b(T): the rows that gather while a request waits,
//                    b = min(B, 1 + rate * (T + q)), at least
//                    min(B, 1 + rate * T) (solved by iteration: a busy
//                    thread lets larger batches form, which cost less per
//                    row, which shortens the queue)
//   utilization      rho  = rate * c(b) / (b * k)
//   queueing         q    = rho / (2 (1 - rho)) * c(b)   (M/D/1)
//   window wait      w    = (1 - rho) (T + rate T^2 / 2) / (1 + rate T)
//                           (a request that finds the threads idle: the
//                           first row waits T, later ones T / 2)
//   mean latency     L(T) = w + q + c(b)        (infinite when rho >= 1)
//
// and picks the candidate (0, and 40 steps from 20 us to 50 ms) with the
// least L. With a latency objective it picks the least L among those whose
// estimated p99, T + c(b) + 4.6 q (an exponential queueing tail), is within
// the objective, and the least p99 when none is. Until a batch size other
// than one was measured, the fit cannot tell fixed from per-row cost and
// the wait is 0 (under load, batches then form while the threads are busy,
// and the fit learns from them).
//
// Thread-safe.

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace asyncps {

struct BatchPolicyOptions {
  bool automatic = false;
  absl::Duration fixed_timeout;  // when !automatic
  int max_batch_rows = 64;
  int threads = 1;
  absl::Duration latency_objective;  // 0 = none (auto only)
};

class BatchPolicy {
 public:
  explicit BatchPolicy(const BatchPolicyOptions& options);

  // A request of `rows` rows arrived at `now`.
  void RecordArrival(absl::Time now, int rows);
  // A batch of `rows` rows took a batch thread `cost` (computing it and
  // answering its requests). Used from the next rate window on.
  void RecordBatch(int rows, absl::Duration cost);

  // The wait to use now.
  absl::Duration Timeout() const;

  // What the policy currently believes (for status and tests).
  struct Estimate {
    double rows_per_s = 0;
    double fixed_us = 0;    // a
    double per_row_us = 0;  // s
    absl::Duration timeout;
  };
  Estimate Current() const;

  // L(T) and the p99 estimate for wait T, in microseconds, from the given
  // model; exposed for tests.
  struct Prediction {
    double mean_us = 0;
    double p99_us = 0;
    bool stable = false;  // rho < 1
    double rows = 0;      // the batch size b(T)
  };
  static Prediction Predict(double t_us, double rows_per_s, double fixed_us,
                            double per_row_us, int max_batch_rows, int threads);

 private:
  void Recompute() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const BatchPolicyOptions options_;
  mutable absl::Mutex mu_;
  absl::Time window_start_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t window_rows_ ABSL_GUARDED_BY(mu_) = 0;  // arrived in the window
  double rows_per_s_ ABSL_GUARDED_BY(mu_) = 0;    // smoothed
  // Decayed sums of the fit c = a + s * b.
  double n_ ABSL_GUARDED_BY(mu_) = 0, sb_ ABSL_GUARDED_BY(mu_) = 0,
            sbb_ ABSL_GUARDED_BY(mu_) = 0, sc_ ABSL_GUARDED_BY(mu_) = 0,
            sbc_ ABSL_GUARDED_BY(mu_) = 0;
  Estimate estimate_ ABSL_GUARDED_BY(mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVING_BATCH_POLICY_H_
