#ifndef ASYNCPS_TESTS_BENCH_GRPC_CEILING_H_
#define ASYNCPS_TESTS_BENCH_GRPC_CEILING_H_

// The gRPC ceiling of push_pull_bench: what gRPC itself moves in the shape
// asyncps's data path uses (one bidirectional stream of raw ByteBuffers per
// connection, answers completing on a DrivenQueue the client's waiting
// thread drives, callback reactors on the server, several requests in flight,
// several connections per server) with the same SGD apply on the server and
// nothing else: no protobuf, no validation, no versions, no de-dup, no
// locks. asyncps's distance to it is asyncps's own cost; its distance to the
// TCP ceiling is gRPC's.
//
// Wire: a request is a 16-byte header {id, op (1 push, 2 pull), payload
// bytes} followed, for a push, by the payload; the answer is the id,
// followed for a pull by the payload.

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace asyncps {
namespace bench {

// Serves the ceiling on 127.0.0.1 (a free port, written to `port_file`),
// on a model of `model_bytes` shared by all streams, or (0) each stream's
// own parameters (ceiling_model.h). Returns only on failure (1).
int GrpcCeilingServerMain(const std::string& port_file, int64_t model_bytes);

struct GrpcCeilingLoad {
  std::vector<std::string> servers;  // host:port
  bool push = true;
  int64_t bytes = 0;    // per call, split evenly over the servers
  int inflight = 2;     // calls in flight
  int connections = 2;  // per server
};

// Connects to every server (each channel ready, at most 30 s), waits for
// `start` (as the asyncps client, which connects before it), calls
// `on_start` with the time the timed loop begins, then moves calls of
// `load` until `until`; returns the payload bytes of the calls answered.
absl::StatusOr<int64_t> RunGrpcCeilingClient(
    const GrpcCeilingLoad& load, std::chrono::steady_clock::time_point start,
    std::chrono::steady_clock::time_point until,
    const std::function<void(std::chrono::steady_clock::time_point)>& on_start);

}  // namespace bench
}  // namespace asyncps

#endif  // ASYNCPS_TESTS_BENCH_GRPC_CEILING_H_
