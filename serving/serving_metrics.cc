#include "serving/serving_metrics.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace asyncps {
namespace {

// 10 us .. ~10 s, a factor of ~1.78 apart (4 per decade).
std::vector<double> SecondsBounds() {
  std::vector<double> b;
  for (double v = 1e-5; v < 12; v *= 1.7782794) b.push_back(v);
  return b;
}

std::vector<double> RowBounds() {
  return {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
}

constexpr const char* kOutcomeNames[kNumOutcomes] = {
    "ok", "invalid", "deadline_exceeded", "overloaded", "unavailable", "error"};

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Record(double value) {
  const size_t i =
      std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  absl::MutexLock l(&mu_);
  ++counts_[i];
  sum_ += value;
}

uint64_t Histogram::count() const {
  absl::MutexLock l(&mu_);
  uint64_t n = 0;
  for (uint64_t c : counts_) n += c;
  return n;
}

double Histogram::Mean() const {
  absl::MutexLock l(&mu_);
  uint64_t n = 0;
  for (uint64_t c : counts_) n += c;
  return n == 0 ? 0 : sum_ / n;
}

double Histogram::Quantile(double q) const {
  absl::MutexLock l(&mu_);
  uint64_t total = 0;
  for (uint64_t c : counts_) total += c;
  if (total == 0) return 0;
  const double want = q * total;
  double seen = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    if (seen + counts_[i] >= want && counts_[i] > 0) {
      const double lo = i == 0 ? 0 : bounds_[i - 1];
      const double hi = i < bounds_.size() ? bounds_[i] : bounds_.back();
      return lo + (hi - lo) * (want - seen) / counts_[i];
    }
    seen += counts_[i];
  }
  return bounds_.back();
}

std::string Histogram::Render(const std::string& name,
                              const std::string& help) const {
  std::string out = absl::StrCat("# HELP ", name, " ", help, "\n# TYPE ", name,
                                 " histogram\n");
  absl::MutexLock l(&mu_);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    absl::StrAppend(&out, name, "_bucket{le=\"",
                    absl::StrFormat("%g", bounds_[i]), "\"} ", cumulative,
                    "\n");
  }
  cumulative += counts_.back();
  absl::StrAppend(&out, name, "_bucket{le=\"+Inf\"} ", cumulative, "\n", name,
                  "_sum ", absl::StrFormat("%.9g", sum_), "\n", name, "_count ",
                  cumulative, "\n");
  return out;
}

ServingMetrics::ServingMetrics()
    : batch_rows_(RowBounds()),
      queue_wait_(SecondsBounds()),
      compute_(SecondsBounds()),
      latency_(SecondsBounds()) {
  for (auto& o : outcomes_) o.store(0);
}

void ServingMetrics::RecordBatch(int rows, absl::Duration compute) {
  batch_rows_.Record(rows);
  compute_.Record(absl::ToDoubleSeconds(compute));
}

void ServingMetrics::RecordQueueWait(absl::Duration wait) {
  queue_wait_.Record(absl::ToDoubleSeconds(wait));
}

void ServingMetrics::RecordRequest(const absl::Status& status,
                                   absl::Duration latency) {
  outcomes_[static_cast<int>(OutcomeOf(status))].fetch_add(1);
  if (status.ok()) latency_.Record(absl::ToDoubleSeconds(latency));
}

Outcome OutcomeOf(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return Outcome::kOk;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
      return Outcome::kInvalid;
    case absl::StatusCode::kDeadlineExceeded:
      return Outcome::kDeadline;
    case absl::StatusCode::kResourceExhausted:
      return Outcome::kOverload;
    case absl::StatusCode::kUnavailable:
      return Outcome::kUnavailable;
    default:
      return Outcome::kError;
  }
}

std::string ServingMetrics::Render() const {
  std::string out;
  absl::StrAppend(
      &out,
      batch_rows_.Render("asyncps_serve_batch_rows",
                         "Rows per computed batch."),
      queue_wait_.Render("asyncps_serve_queue_wait_seconds",
                         "Time a request waited in the batch queue."),
      compute_.Render("asyncps_serve_batch_compute_seconds",
                      "Compute time of one batch."),
      latency_.Render("asyncps_serve_latency_seconds",
                      "End-to-end time of answered requests, arrival to "
                      "answer."),
      "# HELP asyncps_serve_requests_total Requests by outcome.\n"
      "# TYPE asyncps_serve_requests_total counter\n");
  for (int i = 0; i < kNumOutcomes; ++i) {
    absl::StrAppend(&out, "asyncps_serve_requests_total{outcome=\"",
                    kOutcomeNames[i], "\"} ", outcomes_[i].load(), "\n");
  }
  return out;
}

}  // namespace asyncps
