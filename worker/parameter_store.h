#ifndef ASYNCPS_WORKER_PARAMETER_STORE_H_
#define ASYNCPS_WORKER_PARAMETER_STORE_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/asyncps.pb.h"
#include "worker/ps_client.h"

namespace asyncps {

// Where a training loop's parameters live: the sharded cluster, or this
// process (the --local baseline). Both run the same server-side optimizer
// code, so a local run and a cluster run differ only in distribution.
//
// Thread-compatible.
class ParameterStore {
 public:
  virtual ~ParameterStore() = default;

  // Idempotent creation (the creating worker).
  virtual absl::Status Create(const std::vector<TensorSpec>& specs) = 0;
  // Waits until tensors created by another worker exist.
  virtual absl::Status WaitFor(const std::vector<std::string>& names,
                               absl::Duration timeout) = 0;
  virtual absl::Status Pull(
      int64_t clock, const std::vector<std::pair<std::string, float*>>& outs) = 0;
  virtual absl::StatusOr<PushSummary> Push(
      int64_t clock,
      const std::vector<std::pair<std::string, const float*>>& grads) = 0;
  // Renews the lease / says goodbye; a no-op locally.
  virtual absl::Status Heartbeat(int64_t clock, bool leaving) = 0;
  // Number of workers still training (0 locally once done); the final
  // evaluation waits for this to reach 0.
  virtual absl::StatusOr<int> LiveWorkers() = 0;
};

// The cluster, through a PsClient.
std::unique_ptr<ParameterStore> MakeRemoteStore(std::unique_ptr<PsClient> client);

// An in-process single shard (no gRPC, no staleness).
std::unique_ptr<ParameterStore> MakeLocalStore();

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_PARAMETER_STORE_H_
