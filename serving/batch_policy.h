#ifndef ASYNCPS_SERVING_BATCH_POLICY_H_
#define ASYNCPS_SERVING_BATCH_POLICY_H_

// How long a batch waits for more requests before it runs.
//
// Fixed: the operator's --batch_timeout_us. Auto: chosen continuously from
// two measurements, the arrival rate (rows per second over 100 ms windows,
// smoothed) and a batch thread's time per batch (computing and answering)
// as a function of the batch size, c(b) = a + s * b (a least-squares fit
// over recent batches, older ones decaying), and recomputed once per rate
// window. For every candidate wait (0, and 30 steps from 20 us to 50 ms) it
// simulates the batcher's own rule on Poisson arrivals at that rate with
// that cost (batch_simulation.h) and picks the least mean latency (a longer
// wait only where it saves more than 0.5% over every shorter one). With a
// latency objective it picks the least mean among the waits whose p99 is
// within the objective (at most 1% of requests later), or the wait with
// the fewest requests later than it when none is. A fitted fixed cost of 0
// (nothing gained by batching) or no measured rate gives a wait of 0; until
// a batch size other than one was measured, the fit cannot tell fixed from
// per-row cost and the wait is 0 (under load, batches then form while the
// threads are busy, and the fit learns from them).
//
// The search runs on the thread whose arrival closes a rate window, outside
// the policy's lock (0.2-0.5 ms with -O2, ten times a second); one search
// at a time.
//
// Thread-safe.
//
// Example (the Batcher's calls):
//
//   BatchPolicyOptions options;
//   options.automatic = true;
//   options.latency_objective = absl::Milliseconds(5);  // for the p99
//   BatchPolicy policy(options);
//   policy.RecordArrival(absl::Now(), rows);  // each request
//   const absl::Time run_at = oldest_arrival + policy.Timeout();
//   ...
//   policy.RecordBatch(batch_rows, absl::Now() - batch_start);  // each batch

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "serving/batch_simulation.h"

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

 private:
  // The estimate for the given rate and fit sums (n, sum b, sum b^2,
  // sum c, sum b*c). Touches no member but options_ and simulator_.
  Estimate Choose(double rows_per_s, const double sums[5]) const;

  const BatchPolicyOptions options_;
  const BatchSimulator simulator_;
  mutable absl::Mutex mu_;
  absl::Time window_start_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t window_rows_ ABSL_GUARDED_BY(mu_) = 0;  // arrived in the window
  double rows_per_s_ ABSL_GUARDED_BY(mu_) = 0;    // smoothed
  // Decayed sums of the fit c = a + s * b.
  double n_ ABSL_GUARDED_BY(mu_) = 0, sb_ ABSL_GUARDED_BY(mu_) = 0,
            sbb_ ABSL_GUARDED_BY(mu_) = 0, sc_ ABSL_GUARDED_BY(mu_) = 0,
            sbc_ ABSL_GUARDED_BY(mu_) = 0;
  Estimate estimate_ ABSL_GUARDED_BY(mu_);
  bool choosing_ ABSL_GUARDED_BY(mu_) = false;  // a search is running
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVING_BATCH_POLICY_H_
