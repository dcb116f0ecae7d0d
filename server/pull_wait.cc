#include "server/pull_wait.h"

namespace asyncps {

void PullWait::Started(WorkerRegistry::WaitId id) {
  {
    absl::MutexLock l(&mu_);
    if (done_ || id == 0) return;
    id_ = id;
    if (!cancelled_) return;
  }
  registry_->CancelWait(id);
}

void PullWait::Ended() {
  absl::MutexLock l(&mu_);
  done_ = true;
}

void PullWait::Cancel() {
  WorkerRegistry::WaitId id = 0;
  {
    absl::MutexLock l(&mu_);
    cancelled_ = true;
    if (done_) return;
    id = id_;
  }
  if (id != 0) registry_->CancelWait(id);
}

}  // namespace asyncps
