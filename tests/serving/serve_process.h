#ifndef ASYNCPS_TESTS_SERVING_SERVE_PROCESS_H_
#define ASYNCPS_TESTS_SERVING_SERVE_PROCESS_H_

// A ps_serve process for tests: started from its runfile on free ports
// (gRPC and REST) on 127.0.0.1, with a gRPC stub to it; killed by PID when
// the ServeProcess goes.
//
// Example:
//
//   ServeProcess serve = StartServe(
//       {"--servers=" + testing::ServerList(*cluster), "--refresh_s=60"});
//   grpc::ClientContext ctx;
//   serve.stub->ModelInfer(&ctx, request, &response);
//   // REST: http://127.0.0.1:<serve.http_port>/v2/models/mlp/infer

#include <memory>
#include <string>
#include <vector>

#include "proto/grpc_predict_v2.grpc.pb.h"
#include "tests/testing/subprocess.h"

namespace asyncps {

struct ServeProcess {
  std::unique_ptr<testing::Subprocess> process;
  std::string address;  // gRPC's, "127.0.0.1:<port>"
  std::unique_ptr<inference::GRPCInferenceService::Stub> stub;
  int http_port = 0;
};

// Starts ps_serve with `flags` (its source: --servers or --checkpoint_dir,
// and the rest) and waits for both of its ports (REQUIREs them).
ServeProcess StartServe(const std::vector<std::string>& flags);

}  // namespace asyncps

#endif  // ASYNCPS_TESTS_SERVING_SERVE_PROCESS_H_
