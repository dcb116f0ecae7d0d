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

// The callback service with every request and answer as bytes: requests
// are costed before they are parsed (common/parse_cost.h; gRPC's typed
// parse of 64 MiB of empty unknown fields sent to ServerLive took the
// process to gigabytes).
using KServeBase =
    inference::GRPCInferenceService::WithRawCallbackMethod_ServerLive<
        inference::GRPCInferenceService::WithRawCallbackMethod_ServerReady<
            inference::GRPCInferenceService::WithRawCallbackMethod_ModelReady<
                inference::GRPCInferenceService::
                    WithRawCallbackMethod_ServerMetadata<
                        inference::GRPCInferenceService::
                            WithRawCallbackMethod_ModelMetadata<
                                inference::GRPCInferenceService::
                                    WithRawCallbackMethod_ModelInfer<
                                        inference::GRPCInferenceService::
                                            Service>>>>>>;

class KServeService final : public KServeBase {
 public:
  // `handler` is not owned and must outlive the service.
  KServeService(InferenceHandler* handler, std::string server_version)
      : handler_(handler), version_(std::move(server_version)) {}

  // Each takes its request message as bytes and answers its response
  // message.
  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* ctx,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* ctx,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* ctx,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
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
