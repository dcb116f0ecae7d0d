#ifndef ASYNCPS_SERVER_REFLECTION_H_
#define ASYNCPS_SERVER_REFLECTION_H_

#include <string>
#include <vector>

#include "proto/grpc_reflection_v1.grpc.pb.h"
#include "proto/grpc_reflection_v1alpha.grpc.pb.h"

namespace asyncps {

// gRPC server reflection, v1 (grpc.reflection.v1.ServerReflection, which
// newer clients ask for first) and v1alpha (older clients), whose messages
// are the same on the wire. Answers from protobuf's generated descriptor
// pool: list_services (the names given), file_by_filename and
// file_containing_symbol (the file and every file it imports, serialized
// FileDescriptorProtos), file_containing_extension and
// all_extension_numbers_of_type; anything not in the pool is an
// error_response with NOT_FOUND, the stream goes on.
//
// Requests are read as bytes: one over kMaxRequestBytes ends the stream
// RESOURCE_EXHAUSTED, one that does not parse INVALID_ARGUMENT. (gRPC
// 1.51's own v1alpha service, which this replaces, parsed whatever came,
// and an answer echoes its request: one 64 MiB request of empty unknown
// fields took a shard to 4.3 GB.)
class ReflectionAnswers {
 public:
  // A real request names a file or a symbol.
  static constexpr size_t kMaxRequestBytes = 64 << 10;

  // `services`: the fully qualified names list_services reports.
  explicit ReflectionAnswers(std::vector<std::string> services);

  // The answer to one request (no I/O).
  void Answer(const grpc::reflection::v1::ServerReflectionRequest& request,
              grpc::reflection::v1::ServerReflectionResponse* response) const;

 private:
  const std::vector<std::string> services_;
};

// One version's service; `Generated` is its generated ServerReflection.
template <typename Generated>
class ReflectionService final
    : public Generated::template WithRawCallbackMethod_ServerReflectionInfo<
          typename Generated::Service> {
 public:
  // `answers` is not owned and outlives the service.
  explicit ReflectionService(const ReflectionAnswers* answers)
      : answers_(answers) {}

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
  ServerReflectionInfo(grpc::CallbackServerContext* context) override;

 private:
  const ReflectionAnswers* const answers_;
};

using ReflectionV1Service =
    ReflectionService<grpc::reflection::v1::ServerReflection>;
using ReflectionV1AlphaService =
    ReflectionService<grpc::reflection::v1alpha::ServerReflection>;

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_REFLECTION_H_
