#ifndef ASYNCPS_COMMON_EXECUTOR_H_
#define ASYNCPS_COMMON_EXECUTOR_H_

#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace asyncps {

// Runs closures on threads of its own, in submission order per thread: for
// work that must not run on the thread that triggers it (a gRPC dispatch
// thread, a lock holder). Thread-safe.
class Executor {
 public:
  // Starts `threads` (>= 1) threads.
  explicit Executor(int threads);
  // Runs every closure already submitted, then joins the threads.
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Queues `fn`. After the destructor has started, runs it on the caller's
  // thread instead.
  void Run(std::function<void()> fn);

 private:
  void Loop();

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;  // const after construction
};

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_EXECUTOR_H_
