#ifndef ASYNCPS_WORKER_PARAMETER_STORE_H_
#define ASYNCPS_WORKER_PARAMETER_STORE_H_

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/ps_client.h"
#include "common/clock.h"
#include "proto/asyncps.pb.h"
#include "spdlog/spdlog.h"
#include "worker/store_calls.h"

namespace asyncps {

// Where a training loop's parameters live, dense tensors and sparse tables
// alike: the sharded cluster, or this process (the --local baseline). Both
// run the same parameter-store code (store/), so a local run and a cluster
// run differ only in distribution. A step's pull and push are one call
// each (PullSet / PushSet, client/step_sets.h), started and waited for
// separately, so that a loop can overlap them with its computation; a
// step's push is applied whole or not at all on each shard.
//
// Example (one step):
//
//   std::unique_ptr<ParameterStore::PendingPull> pull =
//       store->StartPull(clock, clock, PullSet{{{"w", w}}, {{"emb", ids, e}}});
//   if (absl::Status s = pull->Wait(); !s.ok()) return s;
//   ... gradients gw, ge ...
//   auto push = store->StartPush(
//       clock, PushSet{{{"w", gw}}, {{"emb", ids, ge}}}, pull->read());
//   absl::StatusOr<PushSummary> done = push->Wait();
//
// Thread-compatible: one training loop drives it.
class ParameterStore {
 public:
  // A pull or push in flight (worker/store_calls.h).
  using PendingPull = StorePull;
  using PendingPush = StorePush;

  virtual ~ParameterStore() = default;

  // Idempotent creation of tensors and tables (the creating worker).
  virtual absl::Status Create(const std::vector<TensorSpec>& tensors,
                              const std::vector<TableSpec>& tables) = 0;
  // Waits until the tensors and tables named, created by another worker,
  // exist.
  virtual absl::Status WaitFor(const std::vector<std::string>& names,
                               absl::Duration timeout) = 0;
  // Registers this process; says where to continue (see Registration).
  virtual absl::StatusOr<Registration> Register() = 0;
  // As PsClient::StartPull / StartPush: the buffers (and the gradient
  // memory) stay untouched until the operation's Wait returned.
  virtual std::unique_ptr<PendingPull> StartPull(int64_t clock,
                                                 int64_t for_clock,
                                                 const PullSet& what) = 0;
  virtual std::unique_ptr<PendingPush> StartPush(int64_t clock,
                                                 const PushSet& what,
                                                 const ReadSet& read) = 0;
  // StartPush(clock, push, read), then StartPull(clock + 1, clock + 1,
  // next): on the cluster one message per shard (PsClient::StartStep), the
  // pull served once the push is acknowledged.
  struct Step {
    std::unique_ptr<PendingPush> push;
    std::unique_ptr<PendingPull> pull;
  };
  virtual Step StartStep(int64_t clock, const PushSet& push,
                         const ReadSet& read, const PullSet& next) {
    Step step;
    step.push = StartPush(clock, push, read);
    step.pull = StartPull(clock + 1, clock + 1, next);
    return step;
  }
  // Renews the lease / says goodbye; a no-op locally.
  virtual absl::Status Heartbeat(int64_t clock, bool leaving) = 0;
  // The data position every later call reports: steps of this worker's
  // share whose pushes were all acknowledged (PsClient::ReportTrained); a
  // no-op locally.
  virtual void ReportTrained(int64_t steps) = 0;
  // Number of workers still training (0 locally once done); the final
  // evaluation waits for this to reach 0.
  virtual absl::StatusOr<int> LiveWorkers() = 0;

  // Shorthands for a model of dense tensors only.
  absl::Status Create(const std::vector<TensorSpec>& tensors) {
    return Create(tensors, /*tables=*/{});
  }
  std::unique_ptr<PendingPull> StartPull(
      int64_t clock, int64_t for_clock,
      const std::vector<std::pair<std::string, float*>>& outs) {
    return StartPull(clock, for_clock, PullSet{outs, {}});
  }
  std::unique_ptr<PendingPush> StartPush(
      int64_t clock,
      const std::vector<std::pair<std::string, const float*>>& grads,
      const ReadSet& read) {
    return StartPush(clock, PushSet{grads, {}}, read);
  }
};

// The cluster, through a PsClient.
std::unique_ptr<ParameterStore> MakeRemoteStore(
    std::unique_ptr<PsClient> client);

// Where a worker's share continues after Register(): at the data position
// the shards recorded (Registration::trained), clamped to the share's
// `total_steps`, whatever clock it resumes at; `already_trained` when that
// is the whole share (an earlier process of the worker id finished it).
struct ShareStart {
  int64_t step = 0;
  bool already_trained = false;
};

// The ShareStart of `reg`; logs a resume (or a join at a later clock) at
// info and an already trained share at warn.
ShareStart StartShare(const Registration& reg, int64_t total_steps,
                      int worker_id, spdlog::logger& logger);

// Before the final evaluation: polls store->LiveWorkers() until no worker
// is live, `timeout` passed (then a warning, and OK: evaluate anyway) or
// *stop (if not null) turned true; says every 10 s how many it waits for.
absl::Status WaitForOtherWorkers(ParameterStore* store, absl::Duration timeout,
                                 Clock* clock, const std::atomic<bool>* stop,
                                 spdlog::logger& logger);

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_PARAMETER_STORE_H_
