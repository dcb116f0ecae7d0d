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
    grpc::CallbackServerContext* ctx, const inference::ServerLiveRequest*,
    inference::ServerLiveResponse* response) {
  response->set_live(true);
  return Answer(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* KServeService::ServerReady(
    grpc::CallbackServerContext* ctx, const inference::ServerReadyRequest*,
    inference::ServerReadyResponse* response) {
  response->set_ready(handler_->Ready());
  return Answer(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* KServeService::ModelReady(
    grpc::CallbackServerContext* ctx,
    const inference::ModelReadyRequest* request,
    inference::ModelReadyResponse* response) {
  absl::Status s =
      CheckModel(handler_->model(), request->name(), request->version());
  if (s.ok()) response->set_ready(handler_->Ready());
  return Answer(ctx, s);
}

grpc::ServerUnaryReactor* KServeService::ServerMetadata(
    grpc::CallbackServerContext* ctx, const inference::ServerMetadataRequest*,
    inference::ServerMetadataResponse* response) {
  response->set_name("asyncps");
  response->set_version(version_);
  return Answer(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* KServeService::ModelMetadata(
    grpc::CallbackServerContext* ctx,
    const inference::ModelMetadataRequest* request,
    inference::ModelMetadataResponse* response) {
  absl::Status s =
      CheckModel(handler_->model(), request->name(), request->version());
  if (s.ok()) *response = asyncps::ModelMetadata(handler_->model());
  return Answer(ctx, s);
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
