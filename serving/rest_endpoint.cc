#include "serving/rest_endpoint.h"

#include <httplib.h>

#include <utility>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace asyncps {
namespace {

constexpr char kJson[] = "application/json";

void SendError(const absl::Status& status, httplib::Response& res) {
  res.status = HttpStatusOf(status);
  res.set_content(ErrorJson(status), kJson);
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
                           std::string server_version, int threads,
                           size_t max_body_bytes, TextSource metrics,
                           TextSource status)
    : handler_(handler),
      version_(std::move(server_version)),
      max_body_bytes_(max_body_bytes),
      metrics_(std::move(metrics)),
      status_(std::move(status)),
      listener_("REST", threads,
                [this](httplib::Server* server) { Routes(server); }) {}

void RestEndpoint::Routes(httplib::Server* server) {
  server->set_payload_max_length(max_body_bytes_);
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
    res.set_content(absl::StrCat("{\"name\":\"asyncps\",\"version\":\"",
                                 version_, "\",\"extensions\":[]}"),
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
               [this](const httplib::Request& req, httplib::Response& res) {
                 absl::StatusOr<inference::ModelInferRequest> request =
                     InferRequestFromJson(req.body, req.matches[1]);
                 if (!request.ok()) {
                   handler_->metrics()->RecordRequest(request.status(),
                                                      absl::ZeroDuration());
                   return SendError(request.status(), res);
                 }
                 request->set_model_version(req.matches[2]);
                 absl::Notification answered;
                 absl::StatusOr<inference::ModelInferResponse> answer;
                 handler_->Infer(
                     *request, absl::InfiniteFuture(),
                     [&](absl::StatusOr<inference::ModelInferResponse> r) {
                       answer = std::move(r);
                       answered.Notify();
                     });
                 answered.WaitForNotification();
                 if (!answer.ok()) return SendError(answer.status(), res);
                 res.set_content(InferResponseToJson(*answer), kJson);
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

}  // namespace asyncps
