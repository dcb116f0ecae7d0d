#include "serving/rest_endpoint.h"

#include <httplib.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "serving/http_coding.h"
#include "serving/rest_protocol.h"

namespace asyncps {
namespace {

constexpr char kJson[] = "application/json";
// Infer answers, compressed here when asked: a type the HTTP layer does not
// compress again by itself (it would for exactly "application/json").
constexpr char kJsonAnswer[] = "application/json; charset=utf-8";
constexpr char kBinaryAnswer[] = "application/octet-stream";

void SendError(int http_status, absl::string_view message,
               httplib::Response& res) {
  res.status = http_status;
  res.set_content(ErrorJson(message), kJson);
}

void SendError(const absl::Status& status, httplib::Response& res) {
  SendError(HttpStatusOf(status), status.message(), res);
}

// The answer, binary when it holds binary outputs, compressed when the
// request's Accept-Encoding asks.
void SendAnswer(const httplib::Request& req, RestAnswer answer,
                httplib::Response& res) {
  res.status = 200;
  if (answer.has_binary) {
    res.set_header(kInferenceHeaderLength, std::to_string(answer.json_length));
  }
  const ContentCoding coding =
      AnswerCoding(req.get_header_value("Accept-Encoding"));
  if (coding != ContentCoding::kIdentity) {
    absl::StatusOr<std::string> packed = Compress(answer.body, coding);
    if (packed.ok()) {
      answer.body = *std::move(packed);
      res.set_header("Content-Encoding", CodingName(coding));
    }
  }
  res.set_header("Content-Type",
                 answer.has_binary ? kBinaryAnswer : kJsonAnswer);
  res.body = std::move(answer.body);
}

}  // namespace

int HttpStatusOf(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
      return 400;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

RestEndpoint::RestEndpoint(InferenceHandler* handler,
                           std::string server_version, int max_connections,
                           size_t max_body_bytes, TextSource metrics,
                           TextSource status)
    : handler_(handler),
      version_(std::move(server_version)),
      max_body_bytes_(max_body_bytes),
      metrics_(std::move(metrics)),
      status_(std::move(status)),
      listener_("REST", HttpConnectionLimits{max_connections},
                [this](httplib::Server* server) { Routes(server); }) {}

void RestEndpoint::Routes(httplib::Server* server) {
  server->set_payload_max_length(max_body_bytes_);
  // The HTTP layer writes an answer's headers and body apart; with Nagle's
  // algorithm the body then waits for the client's delayed ACK (~40 ms a
  // request on Linux). Accepted sockets inherit the listening socket's
  // TCP_NODELAY.
  server->set_tcp_nodelay(true);
  server->Get("/v2/health/live",
              [](const httplib::Request&, httplib::Response& res) {
                res.set_content("{\"live\":true}", kJson);
              });
  server->Get("/v2/health/ready", [this](const httplib::Request&,
                                         httplib::Response& res) {
    const bool ready = handler_->Ready();
    res.status = ready ? 200 : 503;
    res.set_content(ready ? "{\"ready\":true}" : "{\"ready\":false}", kJson);
  });
  server->Get("/v2", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(
        absl::StrCat("{\"name\":\"asyncps\",\"version\":\"", version_,
                     "\",\"extensions\":[\"binary_tensor_data\"]}"),
        kJson);
  });
  server->Get(
      R"(/v2/models/([^/]+)(?:/versions/([^/]+))?)",
      [this](const httplib::Request& req, httplib::Response& res) {
        absl::Status s =
            CheckModel(handler_->model(), req.matches[1], req.matches[2]);
        if (!s.ok()) return SendError(s, res);
        res.set_content(ModelMetadataToJson(ModelMetadata(handler_->model())),
                        kJson);
      });
  server->Get(R"(/v2/models/([^/]+)(?:/versions/([^/]+))?/ready)",
              [this](const httplib::Request& req, httplib::Response& res) {
                absl::Status s = CheckModel(handler_->model(), req.matches[1],
                                            req.matches[2]);
                if (!s.ok()) return SendError(s, res);
                const bool ready = handler_->Ready();
                res.status = ready ? 200 : 503;
                res.set_content(
                    ready ? "{\"ready\":true}" : "{\"ready\":false}", kJson);
              });
  server->Post(R"(/v2/models/([^/]+)(?:/versions/([^/]+))?/infer)",
               [this](const httplib::Request& req, httplib::Response& res,
                      const httplib::ContentReader& reader) {
                 Infer(req, res, reader);
               });
  server->Get(
      "/metrics", [this](const httplib::Request&, httplib::Response& res) {
        res.set_content(metrics_(), "text/plain; version=0.0.4; charset=utf-8");
      });
  server->Get("/status",
              [this](const httplib::Request&, httplib::Response& res) {
                res.set_content(status_() + "\n", "text/plain");
              });
}

bool RestEndpoint::ReadBody(const httplib::Request& req,
                            const httplib::ContentReader& reader,
                            std::string* body, httplib::Response& res) {
  // The HTTP layer inflates gzip and deflate as it reads (16 KiB of output
  // at a time); the receiver stops it once the inflated bytes pass the
  // limit.
  bool over = false;
  const bool read = reader([&](const char* data, size_t n) {
    if (n > max_body_bytes_ - body->size()) {
      over = true;
      return false;
    }
    body->append(data, n);
    return true;
  });
  if (over || (!read && res.status == 413)) {
    SendError(
        413,
        absl::StrCat("the request body is over the limit of ", max_body_bytes_,
                     " bytes, decompressed (ps_serve --max_request_bytes)"),
        res);
    return false;
  }
  absl::StatusOr<ContentCoding> coding =
      RequestCoding(req.get_header_value("Content-Encoding"));
  if (!coding.ok()) {
    SendError(415, coding.status().message(), res);
    return false;
  }
  if (!read) {
    SendError(400,
              absl::StrCat("the request body could not be read: it ended "
                           "before its length or is not valid ",
                           CodingName(*coding), " data"),
              res);
    return false;
  }
  return true;
}

void RestEndpoint::Infer(const httplib::Request& req, httplib::Response& res,
                         const httplib::ContentReader& reader) {
  std::string body;
  if (!ReadBody(req, reader, &body, res)) return;
  absl::StatusOr<RestInferRequest> request = ParseRestInferRequest(
      body, req.get_header_value(kInferenceHeaderLength), req.matches[1]);
  if (!request.ok()) {
    handler_->metrics()->RecordRequest(request.status(), absl::ZeroDuration());
    return SendError(request.status(), res);
  }
  std::string().swap(body);  // not held while the request waits
  request->request.set_model_version(req.matches[2]);
  absl::Notification answered;
  absl::StatusOr<inference::ModelInferResponse> answer;
  handler_->Infer(request->request, absl::InfiniteFuture(),
                  [&](absl::StatusOr<inference::ModelInferResponse> r) {
                    answer = std::move(r);
                    answered.Notify();
                  });
  answered.WaitForNotification();
  if (!answer.ok()) return SendError(answer.status(), res);
  SendAnswer(req, EncodeRestInferResponse(*answer, request->outputs), res);
}

}  // namespace asyncps
