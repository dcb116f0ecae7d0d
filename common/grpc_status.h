#ifndef ASYNCPS_COMMON_GRPC_STATUS_H_
#define ASYNCPS_COMMON_GRPC_STATUS_H_

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"

namespace asyncps {

// The one place where absl::Status and grpc::Status meet. Codes map one to
// one (both follow google.rpc.Code); the message is kept.
grpc::Status ToGrpcStatus(const absl::Status& s);
absl::Status FromGrpcStatus(const grpc::Status& s);

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_GRPC_STATUS_H_
