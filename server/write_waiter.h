#ifndef ASYNCPS_SERVER_WRITE_WAITER_H_
#define ASYNCPS_SERVER_WRITE_WAITER_H_

// The writes of a gRPC callback reactor made from a thread of its own that
// waits for each (a stream fed by blocking code: a slot export, the
// replication feed), so that the sender follows the stream's flow control.
//
// Example (in a ServerWriteReactor):
//
//   bool Write(const grpc::ByteBuffer& b) {  // on the feeding thread
//     buffer_ = b;
//     writes_.Started();
//     StartWrite(&buffer_);
//     return writes_.Wait();
//   }
//   void OnWriteDone(bool ok) override { writes_.Done(ok); }
//
// Thread-safe.

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace asyncps {

class WriteWaiter {
 public:
  // Before StartWrite.
  void Started() {
    absl::MutexLock l(&mu_);
    writing_ = true;
  }
  // From OnWriteDone.
  void Done(bool ok) {
    absl::MutexLock l(&mu_);
    ok_ = ok;
    writing_ = false;
  }
  // Waits until the write started last is done: whether it went out
  // (false once the call is gone).
  bool Wait() {
    absl::MutexLock l(&mu_);
    mu_.Await(absl::Condition(
        +[](bool* writing) { return !*writing; }, &writing_));
    return ok_;
  }

 private:
  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool ok_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_WRITE_WAITER_H_
