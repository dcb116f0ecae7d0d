#include "serving/batch_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace asyncps {
namespace {

constexpr absl::Duration kRateWindow = absl::Milliseconds(100);
constexpr double kRateWeight = 0.3;  // of a new window's rate
constexpr double kFitDecay = 0.98;   // of older batches per new one
constexpr int kCandidates = 40;
constexpr double kMinCandidateUs = 20;
constexpr double kMaxCandidateUs = 50000;

}  // namespace

BatchPolicy::BatchPolicy(const BatchPolicyOptions& options)
    : options_(options) {
  absl::MutexLock l(&mu_);
  estimate_.timeout =
      options_.automatic ? absl::ZeroDuration() : options_.fixed_timeout;
}

void BatchPolicy::RecordArrival(absl::Time now, int rows) {
  if (!options_.automatic) return;
  absl::MutexLock l(&mu_);
  if (window_start_ == absl::InfinitePast()) window_start_ = now;
  window_rows_ += rows;
  const absl::Duration elapsed = now - window_start_;
  if (elapsed < kRateWindow) return;
  // Rows per second over the window (robust to bursts, which per-request
  // gaps are not), smoothed over windows.
  const double rate = window_rows_ / absl::ToDoubleSeconds(elapsed);
  rows_per_s_ = rows_per_s_ == 0
                    ? rate
                    : rows_per_s_ + kRateWeight * (rate - rows_per_s_);
  window_start_ = now;
  window_rows_ = 0;
  Recompute();
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
  // The wait is recomputed with the next rate window (RecordArrival), not
  // per batch: a search over every candidate wait costs more than a small
  // batch, and the batch thread would pay it before its next batch.
}

BatchPolicy::Prediction BatchPolicy::Predict(double t_us, double rows_per_s,
                                             double fixed_us, double per_row_us,
                                             int max_batch_rows, int threads) {
  Prediction p;
  const double rate = rows_per_s / 1e6;  // rows per microsecond
  const double k = std::max(1, threads);
  const double cap = max_batch_rows;
  const double window_rows = std::min(cap, 1 + rate * t_us);
  // The batch size where the rows that gather while a request waits (the
  // window, then its queueing) fill its batch; found by damped iteration.
  double b = window_rows;
  for (int i = 0; i < 60; ++i) {
    const double c = fixed_us + per_row_us * b;
    const double rho = rate * c / (b * k);
    double target = cap;
    if (rho < 1) {
      const double q = rho / (2 * (1 - rho)) * c;
      target = std::min(cap, 1 + rate * (t_us + q));
    }
    b = 0.5 * b + 0.5 * std::max(window_rows, target);
  }
  const double c = fixed_us + per_row_us * b;
  const double rho = rate * c / (b * k);
  p.rows = b;
  if (rho >= 1) {
    p.mean_us = p.p99_us = std::numeric_limits<double>::infinity();
    return p;
  }
  const double q = rho / (2 * (1 - rho)) * c;
  // A request that finds the threads idle waits for the window: the first
  // of a batch all of it, the later ones half on average.
  const double window =
      (1 - rho) * t_us * (1 + rate * t_us / 2) / (1 + rate * t_us);
  p.stable = true;
  p.mean_us = window + q + c;
  p.p99_us = t_us + c + 4.6 * q;
  return p;
}

void BatchPolicy::Recompute() {
  Estimate e;
  const double denom = n_ * sbb_ - sb_ * sb_;
  if (n_ > 0 && denom > 1e-6 * n_ * sbb_) {
    e.per_row_us = std::max(0.0, (n_ * sbc_ - sb_ * sc_) / denom);
    e.fixed_us = std::max(0.0, (sc_ - e.per_row_us * sb_) / n_);
  } else if (n_ > 0) {
    e.per_row_us = sc_ / std::max(sb_, 1.0);  // all cost per row: no waiting
  }
  e.rows_per_s = rows_per_s_;
  double best_t = 0;
  if (e.rows_per_s > 0 && e.fixed_us > 0) {
    const double slo_us =
        absl::ToDoubleMicroseconds(options_.latency_objective);
    const double inf = std::numeric_limits<double>::infinity();
    double within_mean = inf, within_t = 0;  // least mean within the SLO
    double any_p99 = inf, any_t = 0;         // least p99 of all
    const double step =
        std::pow(kMaxCandidateUs / kMinCandidateUs, 1.0 / (kCandidates - 1));
    double t = 0;
    for (int i = 0; i <= kCandidates; ++i) {
      const Prediction p = Predict(t, e.rows_per_s, e.fixed_us, e.per_row_us,
                                   options_.max_batch_rows, options_.threads);
      if (p.stable && (slo_us <= 0 || p.p99_us <= slo_us) &&
          p.mean_us < within_mean) {
        within_mean = p.mean_us;
        within_t = t;
      }
      if (p.p99_us < any_p99) {
        any_p99 = p.p99_us;
        any_t = t;
      }
      t = i == 0 ? kMinCandidateUs : t * step;
    }
    if (std::isfinite(within_mean)) {
      best_t = within_t;
    } else if (std::isfinite(any_p99)) {
      best_t = any_t;
    } else {
      // Overloaded at every wait: the queue fills every batch anyway, and
      // waiting would only add to it.
      best_t = 0;
    }
  }
  e.timeout = absl::Microseconds(std::min(best_t, kMaxCandidateUs));
  estimate_ = e;
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
