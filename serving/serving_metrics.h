#ifndef ASYNCPS_SERVING_SERVING_METRICS_H_
#define ASYNCPS_SERVING_SERVING_METRICS_H_

// ps_serve's Prometheus metrics: histograms of batch size, queue wait,
// compute time and end-to-end latency, requests by outcome. Thread-safe;
// recording takes one short lock per histogram.

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace asyncps {

// A Prometheus histogram with fixed upper bounds.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Record(double value);
  // `name`_bucket{le=...}, _sum and _count lines, after HELP and TYPE.
  std::string Render(const std::string& name, const std::string& help) const;
  uint64_t count() const;
  // The mean of the recorded values (0 when empty).
  double Mean() const;
  // The value below which `q` of the recorded values fall, interpolated
  // within a bucket (0 when empty).
  double Quantile(double q) const;

 private:
  const std::vector<double> bounds_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);  // bounds_.size() + 1
  double sum_ ABSL_GUARDED_BY(mu_) = 0;
};

// What became of a request.
enum class Outcome {
  kOk,
  kInvalid,
  kDeadline,
  kOverload,
  kUnavailable,
  kError
};
inline constexpr int kNumOutcomes = 6;

class ServingMetrics {
 public:
  ServingMetrics();

  void RecordBatch(int rows, absl::Duration compute);
  void RecordQueueWait(absl::Duration wait);
  // A request answered after `latency` with `status`.
  void RecordRequest(const absl::Status& status, absl::Duration latency);
  uint64_t requests(Outcome o) const {
    return outcomes_[static_cast<int>(o)].load();
  }
  const Histogram& latency() const { return latency_; }
  const Histogram& batch_rows() const { return batch_rows_; }
  const Histogram& compute() const { return compute_; }  // seconds

  // Every family in the text exposition format.
  std::string Render() const;

 private:
  Histogram batch_rows_, queue_wait_, compute_, latency_;
  std::array<std::atomic<uint64_t>, kNumOutcomes> outcomes_;
};

// The outcome a status stands for.
Outcome OutcomeOf(const absl::Status& status);

}  // namespace asyncps

#endif  // ASYNCPS_SERVING_SERVING_METRICS_H_
