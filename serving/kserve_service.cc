#include "serving/kserve_service.h"

#include <memory>
#include <utility>

#include "absl/time/time.h"
#include "common/fast_frame.h"
#include "common/grpc_status.h"

namespace asyncps {
namespace {

grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* ctx,
                                 const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* KServeService::ServerLive(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  using inference::ServerLiveRequest;
  using inference::ServerLiveResponse;
  return Answer(ctx, AnswerBytes<ServerLiveRequest, ServerLiveResponse>(
                         *request, response,
                         [](const ServerLiveRequest&, ServerLiveResponse* r) {
                           r->set_live(true);
                           return absl::OkStatus();
                         }));
}

grpc::ServerUnaryReactor* KServeService::ServerReady(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  using inference::ServerReadyRequest;
  using inference::ServerReadyResponse;
  return Answer(ctx,
                AnswerBytes<ServerReadyRequest, ServerReadyResponse>(
                    *request, response,
                    [this](const ServerReadyRequest&, ServerReadyResponse* r) {
                      r->set_ready(handler_->Ready());
                      return absl::OkStatus();
                    }));
}

grpc::ServerUnaryReactor* KServeService::ModelReady(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  using inference::ModelReadyRequest;
  using inference::ModelReadyResponse;
  return Answer(ctx,
                AnswerBytes<ModelReadyRequest, ModelReadyResponse>(
                    *request, response,
                    [this](const ModelReadyRequest& q, ModelReadyResponse* r) {
                      absl::Status s =
                          CheckModel(handler_->model(), q.name(), q.version());
                      if (s.ok()) r->set_ready(handler_->Ready());
                      return s;
                    }));
}

grpc::ServerUnaryReactor* KServeService::ServerMetadata(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  using inference::ServerMetadataRequest;
  using inference::ServerMetadataResponse;
  return Answer(
      ctx, AnswerBytes<ServerMetadataRequest, ServerMetadataResponse>(
               *request, response,
               [this](const ServerMetadataRequest&, ServerMetadataResponse* r) {
                 r->set_name("asyncps");
                 r->set_version(version_);
                 return absl::OkStatus();
               }));
}

grpc::ServerUnaryReactor* KServeService::ModelMetadata(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  using inference::ModelMetadataRequest;
  using inference::ModelMetadataResponse;
  return Answer(
      ctx, AnswerBytes<ModelMetadataRequest, ModelMetadataResponse>(
               *request, response,
               [this](const ModelMetadataRequest& q, ModelMetadataResponse* r) {
                 absl::Status s =
                     CheckModel(handler_->model(), q.name(), q.version());
                 if (s.ok()) *r = asyncps::ModelMetadata(handler_->model());
                 return s;
               }));
}

grpc::ServerUnaryReactor* KServeService::ModelInfer(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* bytes,
    grpc::ByteBuffer* response) {
  auto request = std::make_shared<inference::ModelInferRequest>();
  const absl::Status parsed = ParseFromByteBuffer(*bytes, request.get());
  if (!parsed.ok()) {
    handler_->metrics()->RecordRequest(parsed, absl::ZeroDuration());
    return Answer(ctx, parsed);
  }
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const absl::Time deadline = absl::FromChrono(ctx->deadline());
  // The request stays alive until its answer is in.
  handler_->Infer(*request, deadline,
                  [reactor, response,
                   request](absl::StatusOr<inference::ModelInferResponse> r) {
                    if (r.ok()) *response = SerializeToByteBuffer(*r);
                    reactor->Finish(ToGrpcStatus(r.status()));
                  });
  return reactor;
}

}  // namespace asyncps
