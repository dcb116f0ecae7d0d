#include "serving/batch_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace asyncps {
namespace {

constexpr absl::Duration kRateWindow = absl::Milliseconds(100);
constexpr double kRateWeight = 0.3;  // of a new window's rate
constexpr double kFitDecay = 0.98;   // of older batches per new one
constexpr int kCandidates = 30;      // 20 us to 50 ms, 31% apart, and 0
constexpr double kMinCandidateUs = 20;
constexpr double kMaxCandidateUs = 50000;
// The share of the mean latency a longer wait must save to be chosen.
constexpr double kClearGain = 0.005;
// A p99 objective: at most this share of requests may be later.
constexpr double kObjectiveShare = 0.01;

}  // namespace

BatchPolicy::BatchPolicy(const BatchPolicyOptions& options)
    : options_(options) {
  absl::MutexLock l(&mu_);
  estimate_.timeout =
      options_.automatic ? absl::ZeroDuration() : options_.fixed_timeout;
}

void BatchPolicy::RecordArrival(absl::Time now, int rows) {
  if (!options_.automatic) return;
  double rate = 0;
  double sums[5];
  {
    absl::MutexLock l(&mu_);
    if (window_start_ == absl::InfinitePast()) window_start_ = now;
    window_rows_ += rows;
    const absl::Duration elapsed = now - window_start_;
    if (elapsed < kRateWindow) return;
    // Rows per second over the window (robust to bursts, which per-request
    // gaps are not), smoothed over windows.
    const double window_rate = window_rows_ / absl::ToDoubleSeconds(elapsed);
    rows_per_s_ = rows_per_s_ == 0
                      ? window_rate
                      : rows_per_s_ + kRateWeight * (window_rate - rows_per_s_);
    window_start_ = now;
    window_rows_ = 0;
    if (choosing_) return;  // the running search sees the next window's
    choosing_ = true;
    rate = rows_per_s_;
    sums[0] = n_;
    sums[1] = sb_;
    sums[2] = sbb_;
    sums[3] = sc_;
    sums[4] = sbc_;
  }
  const Estimate e = Choose(rate, sums);
  absl::MutexLock l(&mu_);
  estimate_ = e;
  choosing_ = false;
}

void BatchPolicy::RecordBatch(int rows, absl::Duration cost) {
  if (!options_.automatic) return;
  absl::MutexLock l(&mu_);
  const double b = rows, c = absl::ToDoubleMicroseconds(cost);
  n_ = n_ * kFitDecay + 1;
  sb_ = sb_ * kFitDecay + b;
  sbb_ = sbb_ * kFitDecay + b * b;
  sc_ = sc_ * kFitDecay + c;
  sbc_ = sbc_ * kFitDecay + b * c;
  // The wait is chosen again with the next rate window (RecordArrival),
  // not per batch: a search over every candidate wait costs more than a
  // small batch, and the batch thread would pay it before its next batch.
}

BatchPolicy::Estimate BatchPolicy::Choose(double rows_per_s,
                                          const double sums[5]) const {
  const double n = sums[0], sb = sums[1], sbb = sums[2], sc = sums[3],
               sbc = sums[4];
  Estimate e;
  const double denom = n * sbb - sb * sb;
  if (n > 0 && denom > 1e-6 * n * sbb) {
    e.per_row_us = std::max(0.0, (n * sbc - sb * sc) / denom);
    e.fixed_us = std::max(0.0, (sc - e.per_row_us * sb) / n);
  } else if (n > 0) {
    e.per_row_us = sc / std::max(sb, 1.0);  // all cost per row: no waiting
  }
  e.rows_per_s = rows_per_s;
  double best_t = 0;
  BatchingLoad load;
  load.rows_per_s = e.rows_per_s;
  load.fixed_us = e.fixed_us;
  load.per_row_us = e.per_row_us;
  load.max_batch_rows = options_.max_batch_rows;
  load.threads = options_.threads;
  // Overloaded (full batches cannot keep up): every batch is full whatever
  // the wait, and waiting would only add to the queue.
  if (e.rows_per_s > 0 && e.fixed_us > 0 && KeepsUp(load)) {
    const double slo_us =
        absl::ToDoubleMicroseconds(options_.latency_objective);
    const double inf = std::numeric_limits<double>::infinity();
    double within_mean = inf, within_t = 0;  // least mean within the SLO
    double least_over = inf, least_over_t = 0;
    const double step =
        std::pow(kMaxCandidateUs / kMinCandidateUs, 1.0 / (kCandidates - 1));
    double t = 0;
    for (int i = 0; i <= kCandidates; ++i) {
      const BatchingOutcome o = simulator_.Predict(load, t, slo_us);
      // Candidates come shortest first: a longer wait must gain clearly
      // (where a busy thread makes waits alike, the shortest is kept).
      if ((slo_us <= 0 || o.over_objective <= kObjectiveShare) &&
          o.mean_us < (1 - kClearGain) * within_mean) {
        within_mean = o.mean_us;
        within_t = t;
      }
      if (o.over_objective < least_over) {
        least_over = o.over_objective;
        least_over_t = t;
      }
      t = i == 0 ? kMinCandidateUs : t * step;
    }
    best_t = std::isfinite(within_mean) ? within_t : least_over_t;
  }
  e.timeout = absl::Microseconds(std::min(best_t, kMaxCandidateUs));
  return e;
}

absl::Duration BatchPolicy::Timeout() const {
  absl::MutexLock l(&mu_);
  return estimate_.timeout;
}

BatchPolicy::Estimate BatchPolicy::Current() const {
  absl::MutexLock l(&mu_);
  return estimate_;
}

}  // namespace asyncps
