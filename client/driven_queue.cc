#include "client/driven_queue.h"

#include <algorithm>
#include <chrono>

#include "common/clock.h"
#include "common/steady_wait.h"

namespace asyncps {

namespace {
// How long the idle thread drives before it looks whether it still should.
constexpr absl::Duration kIdleSlice = absl::Seconds(1);

absl::Time Now() { return Clock::Monotonic()->Now(); }

// `left` from now as the real-time point gRPC takes (and turns into its own
// monotonic deadline at once).
std::chrono::system_clock::time_point In(absl::Duration left) {
  return absl::ToChronoTime(absl::Now() + left);
}
}  // namespace

DrivenQueue::DrivenQueue(absl::Duration idle_after)
    : idle_after_(idle_after),
      last_wait_(Now()),
      idle_([this] { IdleLoop(); }) {}

DrivenQueue::~DrivenQueue() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
    KickIdle();
    idle_cv_.notify_all();
  }
  idle_.join();
  cq_.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  // Nothing is left to complete (see the header); drain the queue.
  while (cq_.Next(&tag, &ok)) {
  }
}

bool DrivenQueue::WaitUntil(absl::Duration timeout,
                            absl::FunctionRef<bool()> ready) {
  const absl::Time deadline = Now() + timeout;
  mu_.Lock();
  ++waiters_;
  bool done = ready();
  while (!done && Now() < deadline) {
    if (driving_) {
      KickIdle();
      // The driver wakes it after each completion, and its wait on the
      // queue ends by a monotonic deadline: a step back of the real-time
      // clock, which stretches this wait, does not hold it past those.
      cv_.WaitWithTimeout(&mu_, deadline - Now());
    } else {
      driving_ = true;
      mu_.Unlock();
      void* tag = nullptr;
      bool ok = false;
      if (cq_.AsyncNext(&tag, &ok, In(deadline - Now())) ==
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
  --waiters_;
  last_wait_ = Now();
  mu_.Unlock();
  return done;
}

void DrivenQueue::Notify() {
  absl::MutexLock l(&mu_);
  cv_.SignalAll();
}

void DrivenQueue::KickIdle() {
  if (!idle_driving_ || kick_pending_) return;
  kick_pending_ = true;
  kick_.Set(&cq_, std::chrono::system_clock::time_point(), &kick_op_);
}

void DrivenQueue::KickOp::Complete(bool) {
  absl::MutexLock l(&queue_->mu_);
  queue_->kick_pending_ = false;
}

void DrivenQueue::IdleLoop() {
  mu_.Lock();
  while (!stop_) {
    if (waiters_ > 0 || driving_ || Now() < last_wait_ + idle_after_) {
      // Looks again later; waiters never wake this thread (that would cost
      // every call a wake-up).
      AwaitSteadily(
          &mu_, &idle_cv_, std::max(idle_after_ / 2, absl::Milliseconds(10)),
          [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; });
      continue;
    }
    driving_ = true;
    idle_driving_ = true;
    mu_.Unlock();
    void* tag = nullptr;
    bool ok = false;
    if (cq_.AsyncNext(&tag, &ok, In(kIdleSlice)) ==
        grpc::CompletionQueue::GOT_EVENT) {
      static_cast<Op*>(tag)->Complete(ok);
    }
    mu_.Lock();
    driving_ = false;
    idle_driving_ = false;
    cv_.SignalAll();
  }
  mu_.Unlock();
}
}  // namespace asyncps
