#ifndef ASYNCPS_SERVING_REST_ENDPOINT_H_
#define ASYNCPS_SERVING_REST_ENDPOINT_H_

// The REST/JSON form of the Open Inference Protocol, plus ps_serve's
// Prometheus metrics and one-line status, on one HTTP port:
//
//   GET  /v2/health/live            200 {"live": true}
//   GET  /v2/health/ready           200 {"ready": true} or 503
//   GET  /v2                        server metadata
//   GET  /v2/models/<m>             model metadata (404 for another model)
//   GET  /v2/models/<m>/ready       200 or 503
//   POST /v2/models/<m>/infer       inference; 400 bad request, 404 unknown
//                                   model, 429 queue full, 503 no snapshot,
//                                   504 deadline (errors as {"error": ...})
//   GET  /metrics                   Prometheus text
//   GET  /status                    one line (ServingStatusLine)

#include <functional>
#include <string>

#include "common/http_listener.h"
#include "serving/inference_handler.h"

namespace asyncps {

class RestEndpoint {
 public:
  using TextSource = std::function<std::string()>;

  // Not owned; must outlive the endpoint. `metrics` renders /metrics,
  // `status` /status. `threads` handle requests (each waits for its batch).
  // A request body over `max_body_bytes` is refused (413) before it is
  // read.
  RestEndpoint(InferenceHandler* handler, std::string server_version,
               int threads, size_t max_body_bytes, TextSource metrics,
               TextSource status);

  absl::StatusOr<int> Start(const std::string& host, int port) {
    return listener_.Start(host, port);
  }
  void Stop() { listener_.Stop(); }

 private:
  void Routes(httplib::Server* server);

  InferenceHandler* const handler_;
  const std::string version_;
  const size_t max_body_bytes_;
  const TextSource metrics_;
  const TextSource status_;
  HttpListener listener_;
};

// The HTTP status of a refused request.
int HttpStatusOf(const absl::Status& status);

}  // namespace asyncps

#endif  // ASYNCPS_SERVING_REST_ENDPOINT_H_
