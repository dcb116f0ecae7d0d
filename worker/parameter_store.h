#ifndef ASYNCPS_WORKER_PARAMETER_STORE_H_
#define ASYNCPS_WORKER_PARAMETER_STORE_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/ps_client.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

// Where a training loop's parameters live: the sharded cluster, or this
// process (the --local baseline). Both run the same parameter-store code
// (store/), so a local run and a cluster run differ only in distribution.
// Pulls and pushes are started and waited for separately, so that a loop
// can overlap them with its computation.
//
// Thread-compatible: one training loop drives it.
class ParameterStore {
 public:
  // A pull or push in flight; Wait() returns its outcome (again on later
  // calls). Destroying one waits for it.
  class PendingPull {
   public:
    virtual ~PendingPull() = default;
    virtual absl::Status Wait() = 0;
    // What was read; valid after Wait returned OK.
    virtual const ReadSet& read() const = 0;
  };
  class PendingPush {
   public:
    virtual ~PendingPush() = default;
    virtual absl::StatusOr<PushSummary> Wait() = 0;
  };

  virtual ~ParameterStore() = default;

  // Idempotent creation (the creating worker).
  virtual absl::Status Create(const std::vector<TensorSpec>& specs) = 0;
  // Waits until tensors created by another worker exist.
  virtual absl::Status WaitFor(const std::vector<std::string>& names,
                               absl::Duration timeout) = 0;
  // Registers this process; says where to continue (see Registration).
  virtual absl::StatusOr<Registration> Register() = 0;
  // As PsClient::StartPull / StartPush: the buffers (and the gradient
  // memory) stay untouched until the operation's Wait returned.
  virtual std::unique_ptr<PendingPull> StartPull(
      int64_t clock, int64_t for_clock,
      const std::vector<std::pair<std::string, float*>>& outs) = 0;
  virtual std::unique_ptr<PendingPush> StartPush(
      int64_t clock,
      const std::vector<std::pair<std::string, const float*>>& grads,
      const ReadSet& read) = 0;
  // Renews the lease / says goodbye; a no-op locally.
  virtual absl::Status Heartbeat(int64_t clock, bool leaving) = 0;
  // The data position every later call reports: steps of this worker's
  // share whose pushes were all acknowledged (PsClient::ReportTrained); a
  // no-op locally.
  virtual void ReportTrained(int64_t steps) = 0;
  // Number of workers still training (0 locally once done); the final
  // evaluation waits for this to reach 0.
  virtual absl::StatusOr<int> LiveWorkers() = 0;
};

// The cluster, through a PsClient.
std::unique_ptr<ParameterStore> MakeRemoteStore(
    std::unique_ptr<PsClient> client);

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_PARAMETER_STORE_H_
