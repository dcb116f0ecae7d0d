#ifndef ASYNCPS_SERVER_REFLECTION_V1_H_
#define ASYNCPS_SERVER_REFLECTION_V1_H_

#include <string>
#include <vector>

#include "proto/grpc_reflection_v1.grpc.pb.h"

namespace asyncps {

// gRPC server reflection v1 (grpc.reflection.v1.ServerReflection). gRPC
// 1.51's plugin serves only v1alpha, and newer clients ask for v1 first.
// Answers from protobuf's generated descriptor pool: list_services (the
// names given), file_by_filename and file_containing_symbol (the file and
// every file it imports, serialized FileDescriptorProtos),
// file_containing_extension and all_extension_numbers_of_type; anything
// not in the pool is an error_response with NOT_FOUND, the stream goes on.
//
// Thread-safe: streams are independent; each answers its requests in order.
class ReflectionV1Service final
    : public grpc::reflection::v1::ServerReflection::CallbackService {
 public:
  // `services`: the fully qualified names list_services reports.
  explicit ReflectionV1Service(std::vector<std::string> services);

  grpc::ServerBidiReactor<grpc::reflection::v1::ServerReflectionRequest,
                          grpc::reflection::v1::ServerReflectionResponse>*
  ServerReflectionInfo(grpc::CallbackServerContext* context) override;

  // The answer to one request (no I/O).
  void Answer(const grpc::reflection::v1::ServerReflectionRequest& request,
              grpc::reflection::v1::ServerReflectionResponse* response) const;

 private:
  const std::vector<std::string> services_;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_REFLECTION_V1_H_
