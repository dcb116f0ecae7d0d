#ifndef ASYNCPS_SERVING_KSERVE_SERVICE_H_
#define ASYNCPS_SERVING_KSERVE_SERVICE_H_

// inference.GRPCInferenceService (proto/grpc_predict_v2.proto) over an
// InferenceHandler, on gRPC's callback API: a request waiting for its batch
// holds no thread. ModelInfer takes its request as bytes and parses it
// itself, after checking what the parsed form would take in memory
// (common/parse_cost.h): up to --max_request_bytes of tiny repeated inputs
// would otherwise parse into gigabytes before any check.

#include <string>

#include "proto/grpc_predict_v2.grpc.pb.h"
#include "serving/inference_handler.h"

namespace asyncps {

// The callback service with ModelInfer's request and answer as bytes.
using KServeBase =
    inference::GRPCInferenceService::WithCallbackMethod_ServerLive<
        inference::GRPCInferenceService::WithCallbackMethod_ServerReady<
            inference::GRPCInferenceService::WithCallbackMethod_ModelReady<
                inference::GRPCInferenceService::
                    WithCallbackMethod_ServerMetadata<
                        inference::GRPCInferenceService::
                            WithCallbackMethod_ModelMetadata<
                                inference::GRPCInferenceService::
                                    WithRawCallbackMethod_ModelInfer<
                                        inference::GRPCInferenceService::
                                            Service>>>>>>;

class KServeService final : public KServeBase {
 public:
  // `handler` is not owned and must outlive the service.
  KServeService(InferenceHandler* handler, std::string server_version)
      : handler_(handler), version_(std::move(server_version)) {}

  grpc::ServerUnaryReactor* ServerLive(
      grpc::CallbackServerContext* ctx, const inference::ServerLiveRequest*,
      inference::ServerLiveResponse* response) override;
  grpc::ServerUnaryReactor* ServerReady(
      grpc::CallbackServerContext* ctx, const inference::ServerReadyRequest*,
      inference::ServerReadyResponse* response) override;
  grpc::ServerUnaryReactor* ModelReady(
      grpc::CallbackServerContext* ctx,
      const inference::ModelReadyRequest* request,
      inference::ModelReadyResponse* response) override;
  grpc::ServerUnaryReactor* ServerMetadata(
      grpc::CallbackServerContext* ctx, const inference::ServerMetadataRequest*,
      inference::ServerMetadataResponse* response) override;
  grpc::ServerUnaryReactor* ModelMetadata(
      grpc::CallbackServerContext* ctx,
      const inference::ModelMetadataRequest* request,
      inference::ModelMetadataResponse* response) override;
  // A ModelInferRequest in, a ModelInferResponse out.
  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;

 private:
  InferenceHandler* const handler_;
  const std::string version_;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVING_KSERVE_SERVICE_H_
