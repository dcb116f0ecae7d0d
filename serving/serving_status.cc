#include "serving/serving_status.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace asyncps {
namespace {

void Gauge(std::string* out, const char* name, const char* type,
           const char* help, double value) {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type,
                  "\n", name, " ", absl::StrFormat("%.9g", value), "\n");
}

}  // namespace

std::string ServingStatus::Metrics() const {
  std::string out = handler_->metrics()->Render();
  std::shared_ptr<const Snapshot> s = snapshots_->Current();
  Gauge(&out, "asyncps_serve_ready", "gauge",
        "1 when a parameter snapshot is held.", s != nullptr);
  Gauge(&out, "asyncps_serve_snapshot_age_seconds", "gauge",
        "Age of the snapshot answers are computed with.",
        s == nullptr ? 0 : absl::ToDoubleSeconds(absl::Now() - s->taken));
  Gauge(&out, "asyncps_serve_snapshot_id", "gauge",
        "Snapshots read so far (the current one's id).",
        s == nullptr ? 0 : static_cast<double>(s->id));
  Gauge(&out, "asyncps_serve_snapshot_version", "gauge",
        "Updates applied to the parameters of the current snapshot.",
        s == nullptr ? 0 : static_cast<double>(s->version_sum));
  Gauge(&out, "asyncps_serve_refresh_failures_total", "counter",
        "Snapshot reads that failed (the last snapshot kept serving).",
        static_cast<double>(snapshots_->refresh_failures()));
  Gauge(&out, "asyncps_serve_queue_requests", "gauge",
        "Requests waiting for a batch.", batcher_->queued());
  const BatchPolicy::Estimate e = batcher_->policy().Current();
  Gauge(&out, "asyncps_serve_batch_timeout_seconds", "gauge",
        "The batch wait in effect (chosen by the policy when auto).",
        absl::ToDoubleSeconds(e.timeout));
  Gauge(&out, "asyncps_serve_arrival_rows_per_second", "gauge",
        "Measured arrival rate (auto policy).", e.rows_per_s);
  Gauge(&out, "asyncps_serve_batch_fixed_seconds", "gauge",
        "Fitted fixed cost of a batch, a in a + s * rows (auto policy).",
        e.fixed_us / 1e6);
  Gauge(&out, "asyncps_serve_batch_row_seconds", "gauge",
        "Fitted cost per row of a batch, s in a + s * rows (auto policy).",
        e.per_row_us / 1e6);
  return out;
}

std::string ServingStatus::Line() const {
  std::shared_ptr<const Snapshot> s = snapshots_->Current();
  const ServingMetrics& m = *handler_->metrics();
  std::string line = absl::StrCat(s != nullptr ? "ready" : "not ready",
                                  " model ", handler_->model().name);
  if (s != nullptr) {
    absl::StrAppend(
        &line, " snapshot ", s->id, " (version ", s->version_sum, ", age ",
        absl::StrFormat("%.1f", absl::ToDoubleSeconds(absl::Now() - s->taken)),
        " s)");
  }
  absl::StrAppend(&line, " from ", source_->Describe());
  const std::string error = snapshots_->last_error();
  if (!error.empty()) absl::StrAppend(&line, " [refresh failing: ", error, "]");
  absl::StrAppend(
      &line, "; queue ", batcher_->queued(), ", timeout ",
      absl::FormatDuration(batcher_->policy().Timeout()), "; requests ok ",
      m.requests(Outcome::kOk), " invalid ", m.requests(Outcome::kInvalid),
      " deadline ", m.requests(Outcome::kDeadline), " overloaded ",
      m.requests(Outcome::kOverload), " unavailable ",
      m.requests(Outcome::kUnavailable), " error ", m.requests(Outcome::kError),
      "; latency p50 ",
      absl::StrFormat("%.2f", m.latency().Quantile(0.5) * 1e3), " ms p99 ",
      absl::StrFormat("%.2f", m.latency().Quantile(0.99) * 1e3),
      " ms; mean batch ", absl::StrFormat("%.1f", m.batch_rows().Mean()),
      " rows");
  return line;
}

}  // namespace asyncps
