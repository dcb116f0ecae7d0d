#ifndef ASYNCPS_SERVER_PULL_WAIT_H_
#define ASYNCPS_SERVER_PULL_WAIT_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/worker_registry.h"

namespace asyncps {

// A pull that may wait (WorkerRegistry::WhenReady), as its call sees it:
// lets the call's cancellation reach the registry whichever of the two
// comes first, the wait being registered or the caller going away.
//
//   auto wait = std::make_shared<PullWait>(registry);
//   // The call's OnCancel: wait->Cancel().
//   WorkerRegistry::WaitId id = registry->WhenReady(
//       worker, clock, [wait](absl::Status s) { wait->Ended(); ... });
//   wait->Started(id);
//
// Thread-safe.
class PullWait {
 public:
  // Not owned; must outlive the wait.
  explicit PullWait(WorkerRegistry* registry) : registry_(registry) {}

  // WhenReady returned `id` (0: the pull did not wait). Cancels the wait
  // if the caller went away before.
  void Started(WorkerRegistry::WaitId id);
  // The wait ended (its callback runs): a later Cancel does nothing.
  void Ended();
  // The caller went away: the wait, if registered and not ended, is
  // cancelled (now, or in Started).
  void Cancel();

 private:
  WorkerRegistry* const registry_;
  absl::Mutex mu_;
  WorkerRegistry::WaitId id_ ABSL_GUARDED_BY(mu_) = 0;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_PULL_WAIT_H_
