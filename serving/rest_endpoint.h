#ifndef ASYNCPS_SERVING_REST_ENDPOINT_H_
#define ASYNCPS_SERVING_REST_ENDPOINT_H_

// The REST form of the Open Inference Protocol (JSON and the binary tensor
// data extension, serving/rest_protocol.h), plus ps_serve's Prometheus
// metrics and one-line status, on one HTTP port:
//
//   GET  /v2/health/live            200 {"live": true}
//   GET  /v2/health/ready           200 {"ready": true} or 503
//   GET  /v2                        server metadata
//   GET  /v2/models/<m>             model metadata (404 for another model)
//   GET  /v2/models/<m>/ready       200 or 503
//   POST /v2/models/<m>/infer       inference; 400 bad request, 404 unknown
//                                   model, 413 body over the limit, 415
//                                   unknown Content-Encoding, 429 queue
//                                   full, 503 no snapshot, 504 deadline
//                                   (errors as {"error": ...})
//   GET  /metrics                   Prometheus text
//   GET  /status                    one line (ServingStatusLine)
//
// An infer body is read as JSON (or the binary extension, when the
// Inference-Header-Content-Length header is there) whatever its
// Content-Type says (curl -d sends a form type), gzip or deflate when its
// Content-Encoding says so; the answer is compressed when Accept-Encoding
// asks (serving/http_coding.h).

#include <functional>
#include <string>

#include "common/http_listener.h"
#include "serving/inference_handler.h"

namespace httplib {
class ContentReader;
struct Request;
struct Response;
}  // namespace httplib

namespace asyncps {

// Thread-safe: requests are answered on the listener's threads at once.
class RestEndpoint {
 public:
  using TextSource = std::function<std::string()>;

  // Not owned; must outlive the endpoint. `metrics` renders /metrics,
  // `status` /status. Up to `max_connections` connections are served at
  // once, each on a thread of its own (a request waits for its batch there).
  // A request body over `max_body_bytes` is refused (413): by its
  // Content-Length before it is read, or, compressed or chunked, as soon
  // as its decompressed bytes pass the limit.
  RestEndpoint(InferenceHandler* handler, std::string server_version,
               int max_connections, size_t max_body_bytes, TextSource metrics,
               TextSource status);

  absl::StatusOr<int> Start(const std::string& host, int port) {
    return listener_.Start(host, port);
  }
  void Stop() { listener_.Stop(); }

 private:
  void Routes(httplib::Server* server);
  void Infer(const httplib::Request& req, httplib::Response& res,
             const httplib::ContentReader& reader);
  // The body, inflated, into *body; false after answering a refusal.
  bool ReadBody(const httplib::Request& req,
                const httplib::ContentReader& reader, std::string* body,
                httplib::Response& res);

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
