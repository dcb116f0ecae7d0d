#ifndef ASYNCPS_TESTS_TESTING_ALARM_OP_H_
#define ASYNCPS_TESTS_TESTING_ALARM_OP_H_

// An operation on a DrivenQueue (client/driven_queue.h) that completes like
// any call, `after` from now: a grpc::Alarm's expiry. It records the
// thread it completed on.
//
//   DrivenQueue queue;
//   testing::AlarmOp op(&queue, absl::Milliseconds(20));
//   queue.WaitUntil(absl::Seconds(1), [&] { return op.done(); });

#include <grpcpp/alarm.h>

#include <atomic>
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/driven_queue.h"

namespace asyncps::testing {

class AlarmOp : public DrivenQueue::Op {
 public:
  AlarmOp(DrivenQueue* queue, absl::Duration after) {
    alarm_.Set(queue->cq(), absl::ToChronoTime(absl::Now() + after), this);
  }
  void Complete(bool ok) override {
    ok_ = ok;
    thread_ = std::this_thread::get_id();
    done_.store(true);
  }
  bool done() const { return done_.load(); }
  bool ok() const { return ok_; }
  std::thread::id thread() const { return thread_; }

 private:
  grpc::Alarm alarm_;
  bool ok_ = false;
  std::thread::id thread_;
  std::atomic<bool> done_{false};
};

}  // namespace asyncps::testing

#endif  // ASYNCPS_TESTS_TESTING_ALARM_OP_H_
