#ifndef ASYNCPS_TOOLS_SHARD_QUERY_H_
#define ASYNCPS_TOOLS_SHARD_QUERY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/security.h"
#include "proto/asyncps.grpc.pb.h"
#include "tools/status_table.h"

namespace asyncps {

// One shard's answer to ListTensors, or why there is none.
struct TensorListResult {
  int index = 0;
  std::string address;
  bool up = false;
  std::string error;
  ListTensorsResponse tensors;
};

// One shard's answer to Checkpoint, or why there is none.
struct CheckpointResult {
  int index = 0;
  std::string address;
  bool ok = false;
  std::string error;          // when !ok: "CODE: message"
  CheckpointInfo checkpoint;  // when ok
};

// One shard's answer to grpc.health.v1.Health/Check, or why there is none.
struct HealthResult {
  int index = 0;
  std::string address;
  bool answered = false;
  std::string status;  // when answered: "SERVING", "NOT_SERVING", ...
  std::string error;   // when !answered: "CODE: message"
};

// Asks every shard of a cluster, concurrently, through the retry engine of
// the client (client/fanout.h): each shard is tried again once, shortly
// after, when its attempt fails in a way a retry can cure (UNAVAILABLE: a
// connection lost mid-call, a shard restarting), and every call ends within
// its timeout. A shard that does not answer in time (or at all) is reported
// down with its last gRPC error; nothing here fails as a whole.
//
// Thread-compatible: one caller at a time. Channels are opened once and
// reused across calls (psctl --watch).
class ShardQuery {
 public:
  // `security`: TLS and cluster token for every shard (common/security.h).
  explicit ShardQuery(std::vector<std::string> addresses,
                      const SecurityOptions& security = SecurityOptions());
  ~ShardQuery();

  // Status of every shard, in address order.
  std::vector<ShardResult> Status(absl::Duration timeout,
                                  const StatusRequest& request = {});
  // ListTensors of every shard, in address order.
  std::vector<TensorListResult> ListTensors(absl::Duration timeout);
  // Checkpoint of every shard, all at once, in address order.
  std::vector<CheckpointResult> Checkpoint(absl::Duration timeout);
  // The health of `service` ("" = the server as a whole) on every shard.
  std::vector<HealthResult> Health(absl::Duration timeout,
                                   const std::string& service);

 private:
  const std::vector<std::string> addresses_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<ParameterServer::Stub>> stubs_;
};

}  // namespace asyncps

#endif  // ASYNCPS_TOOLS_SHARD_QUERY_H_
