#include "serving/batch_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace asyncps {
namespace {

constexpr double kArrivalWeight = 0.02;  // of a new gap in the average
constexpr double kFitDecay = 0.98;       // of older batches per new one
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
  if (last_arrival_ != absl::InfinitePast()) {
    const double gap =
        std::max(0.0, absl::ToDoubleMicroseconds(now - last_arrival_));
    gap_us_ = gap_us_ == 0 ? gap : gap_us_ + kArrivalWeight * (gap - gap_us_);
    rows_ += kArrivalWeight * (rows - rows_);
  }
  last_arrival_ = now;
  if (++updates_ % 16 == 0) Recompute();
}

void BatchPolicy::RecordBatch(int rows, absl::Duration compute) {
  if (!options_.automatic) return;
  absl::MutexLock l(&mu_);
  const double b = rows, c = absl::ToDoubleMicroseconds(compute);
  n_ = n_ * kFitDecay + 1;
  sb_ = sb_ * kFitDecay + b;
  sbb_ = sbb_ * kFitDecay + b * b;
  sc_ = sc_ * kFitDecay + c;
  sbc_ = sbc_ * kFitDecay + b * c;
  Recompute();
}

BatchPolicy::Prediction BatchPolicy::Predict(double t_us, double rows_per_s,
                                             double fixed_us, double per_row_us,
                                             int max_batch_rows, int threads) {
  Prediction p;
  const double rate_us = rows_per_s / 1e6;  // rows per microsecond
  const double b = std::min<double>(max_batch_rows, 1 + rate_us * t_us);
  const double c = fixed_us + per_row_us * b;
  const double rho = rate_us * c / (b * std::max(1, threads));
  const double window =
      (t_us + rate_us * t_us * t_us / 2) / (1 + rate_us * t_us);
  if (rho >= 1) {
    p.mean_us = p.p99_us = std::numeric_limits<double>::infinity();
    return p;
  }
  const double q = rho / (2 * (1 - rho)) * c;
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
  e.rows_per_s = gap_us_ > 0 ? rows_ * 1e6 / gap_us_ : 0;
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
      // Overloaded at every wait: full batches as fast as they fill.
      best_t = (options_.max_batch_rows - 1) * 1e6 / e.rows_per_s;
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
