#include "client/driven_queue.h"

#include <chrono>

namespace asyncps {

DrivenQueue::~DrivenQueue() {
  cq_.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  // Nothing is left to complete (see the header); drain the queue.
  while (cq_.Next(&tag, &ok)) {
  }
}

bool DrivenQueue::WaitUntil(absl::Duration timeout,
                            absl::FunctionRef<bool()> ready) {
  const absl::Time deadline = absl::Now() + timeout;
  mu_.Lock();
  bool done = ready();
  while (!done && absl::Now() < deadline) {
    if (driving_) {
      cv_.WaitWithDeadline(&mu_, deadline);
    } else {
      driving_ = true;
      mu_.Unlock();
      void* tag = nullptr;
      bool ok = false;
      if (cq_.AsyncNext(&tag, &ok, absl::ToChronoTime(deadline)) ==
          grpc::CompletionQueue::GOT_EVENT) {
        static_cast<Op*>(tag)->Complete(ok);
      }
      mu_.Lock();
      driving_ = false;
      // A completion may have been another waiter's; one of them drives
      // next if this thread is done.
      cv_.SignalAll();
    }
    done = ready();
  }
  if (done && !driving_) {
    // Runs what has completed already (typically a write's completion,
    // which comes before its answer), so that the streams are ready for
    // the next request without waiting for the next waiter.
    driving_ = true;
    mu_.Unlock();
    void* tag = nullptr;
    bool ok = false;
    while (cq_.AsyncNext(&tag, &ok, std::chrono::system_clock::time_point()) ==
           grpc::CompletionQueue::GOT_EVENT) {
      static_cast<Op*>(tag)->Complete(ok);
    }
    mu_.Lock();
    driving_ = false;
    cv_.SignalAll();
  }
  mu_.Unlock();
  return done;
}

void DrivenQueue::Notify() {
  absl::MutexLock l(&mu_);
  cv_.SignalAll();
}

}  // namespace asyncps
