#ifndef ASYNCPS_SERVER_METRICS_HTTP_H_
#define ASYNCPS_SERVER_METRICS_HTTP_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/http_listener.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

// Renders one shard's status in the Prometheus text exposition format 0.0.4:
// counters (`asyncps_*_total`), gauges, per-worker gauges labelled
// worker="<id>", and the push staleness histogram with cumulative `le`
// buckets, `_sum` and `_count`. Every sample carries shard="<index>".
std::string RenderPrometheus(const StatusResponse& status);

// The content type of RenderPrometheus's output.
inline constexpr char kPrometheusContentType[] =
    "text/plain; version=0.0.4; charset=utf-8";

// Serves `GET /metrics` (and `GET /` with a pointer to it) over plain HTTP on
// its own thread, rendering a fresh StatusResponse from `source` for every
// scrape, followed by the text of `extra` (more families in the same
// format, e.g. RPC and process metrics) when given.
//
// Thread-safe. `source` and `extra` are called on the server's threads and
// must stay callable until Stop() returns.
class MetricsHttpServer {
 public:
  using StatusSource = std::function<StatusResponse()>;
  using TextSource = std::function<std::string()>;

  explicit MetricsHttpServer(StatusSource source, TextSource extra = nullptr);
  ~MetricsHttpServer();  // Stop()
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // Binds host:port (port 0 = a free port) and starts serving. Returns the
  // bound port; UNAVAILABLE if the address cannot be bound,
  // FAILED_PRECONDITION if already started. After an error, call Stop()
  // before starting again.
  absl::StatusOr<int> Start(const std::string& host, int port);

  // Stops accepting, finishes the serving thread. Idempotent; a no-op if
  // never started.
  void Stop();

 private:
  const StatusSource source_;
  const TextSource extra_;
  HttpListener listener_;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_METRICS_HTTP_H_
