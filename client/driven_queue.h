#ifndef ASYNCPS_CLIENT_DRIVEN_QUEUE_H_
#define ASYNCPS_CLIENT_DRIVEN_QUEUE_H_

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <functional>
#include <memory>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace asyncps {

// A gRPC completion queue driven by the threads that wait for its
// operations, the way gRPC's synchronous API drives its calls: the thread
// that waits for an answer reads it off the connection and runs its
// completion itself, instead of a gRPC callback thread running it and then
// waking the waiter: fewer thread switches per call, and a small call costs
// the client about a third less CPU (python/bench/message_cost.py).
//
// One thread at a time drives (polls the queue and runs what completes);
// the others wait and are woken after every completion to look at their own
// condition, and one of them takes over when the driver's condition holds.
// Once no thread has waited for `idle_after`, the queue's own thread drives
// it until one does again (the first waiter then wakes it with an alarm and
// takes over): what arrives while the process waits for nothing is still
// read, an HTTP/2 keepalive answer above all, which would otherwise wait
// for gRPC's backup poll (every 5 s) and the connection be closed as dead.
//
// Thread-safe.
class DrivenQueue {
 public:
  // The tag of one operation on the queue: Complete runs once, on a waiting
  // thread, with no lock of the queue held.
  class Op {
   public:
    virtual void Complete(bool ok) = 0;

   protected:
    ~Op() = default;
  };

  explicit DrivenQueue(absl::Duration idle_after = absl::Milliseconds(500));
  // Stops the idle thread and shuts the queue down. Every operation started
  // on it must have completed (its owner waited for it).
  ~DrivenQueue();
  DrivenQueue(const DrivenQueue&) = delete;
  DrivenQueue& operator=(const DrivenQueue&) = delete;

  grpc::CompletionQueue* cq() { return &cq_; }

  // Runs completions until ready() holds or `timeout` has passed; returns
  // ready(). ready() is called with the queue's lock held: it must be
  // cheap and must not take a lock that is held while calling Notify.
  bool WaitUntil(absl::Duration timeout, absl::FunctionRef<bool()> ready);

  // Starts a unary call prepared on cq() (stub->PrepareAsyncMethod(ctx,
  // request, cq())): done(status) runs once it has completed, on a waiting
  // thread. `response` must outlive that.
  template <typename Response>
  void StartUnary(
      std::unique_ptr<grpc::ClientAsyncResponseReader<Response>> call,
      Response* response, std::function<void(grpc::Status)> done);

  // Wakes the waiters to call their ready() again, for a change made on a
  // thread that is not driving (the driver wakes them after each
  // completion). A driver blocked on the queue is not woken.
  void Notify();

 private:
  // The alarm's tag that makes the idle thread give up driving.
  class KickOp : public Op {
   public:
    explicit KickOp(DrivenQueue* queue) : queue_(queue) {}
    void Complete(bool ok) override;

   private:
    DrivenQueue* const queue_;
  };

  // Drives the queue while no thread waits on it (see above).
  void IdleLoop();
  // Wakes the idle thread out of the queue, if it drives it.
  void KickIdle() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration idle_after_;
  grpc::CompletionQueue cq_;
  grpc::Alarm kick_;
  KickOp kick_op_{this};
  absl::Mutex mu_;
  absl::CondVar cv_;  // waiters: a completion ran, or Notify
  // The idle thread: stop. Its waits are on the monotonic clock
  // (common/steady_wait.h), as every time here is (Clock::Monotonic): a
  // step of the real-time clock neither stretches a wait's timeout nor
  // keeps the idle thread from driving.
  std::condition_variable_any idle_cv_;
  bool driving_ ABSL_GUARDED_BY(mu_) = false;
  bool idle_driving_ ABSL_GUARDED_BY(mu_) = false;  // the idle thread drives
  bool kick_pending_ ABSL_GUARDED_BY(mu_) = false;  // kick_ set, not run
  int waiters_ ABSL_GUARDED_BY(mu_) = 0;            // threads in WaitUntil
  absl::Time last_wait_ ABSL_GUARDED_BY(mu_);  // when one last left (monotonic)
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread idle_;  // last: starts once the rest is set up
};

namespace driven_queue_internal {

// A unary call on a DrivenQueue; deletes itself once done has run.
template <typename Response>
class UnaryOp final : public DrivenQueue::Op {
 public:
  UnaryOp(std::unique_ptr<grpc::ClientAsyncResponseReader<Response>> call,
          std::function<void(grpc::Status)> done)
      : call_(std::move(call)), done_(std::move(done)) {}

  void Start(Response* response) {
    call_->StartCall();
    call_->Finish(response, &status_, this);
  }

  void Complete(bool) override {
    std::function<void(grpc::Status)> done = std::move(done_);
    const grpc::Status status = std::move(status_);
    delete this;
    done(status);
  }

 private:
  std::unique_ptr<grpc::ClientAsyncResponseReader<Response>> call_;
  std::function<void(grpc::Status)> done_;
  grpc::Status status_;
};

}  // namespace driven_queue_internal

template <typename Response>
void DrivenQueue::StartUnary(
    std::unique_ptr<grpc::ClientAsyncResponseReader<Response>> call,
    Response* response, std::function<void(grpc::Status)> done) {
  auto* op = new driven_queue_internal::UnaryOp<Response>(std::move(call),
                                                          std::move(done));
  op->Start(response);
}

}  // namespace asyncps

#endif  // ASYNCPS_CLIENT_DRIVEN_QUEUE_H_
