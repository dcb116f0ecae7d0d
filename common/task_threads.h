#ifndef ASYNCPS_COMMON_TASK_THREADS_H_
#define ASYNCPS_COMMON_TASK_THREADS_H_

// A thread of its own for each task, up to a cap: for tasks that block for
// a long or unknown time (an HTTP connection, a slot move waiting on
// another shard), which a fixed pool would let starve one another. Threads
// are joined, never detached: Shutdown() returns once every task ended.
//
// Example:
//
//   TaskThreads threads(64);
//   if (!threads.TryRun([=] { Serve(call); })) Refuse(call);
//   ...
//   threads.Shutdown();  // after making the running tasks end
//
// Thread-safe.

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace asyncps {

class TaskThreads {
 public:
  explicit TaskThreads(int max_running);
  ~TaskThreads();  // Shutdown()
  TaskThreads(const TaskThreads&) = delete;
  TaskThreads& operator=(const TaskThreads&) = delete;

  // Starts (a copy of) `task` on a new thread; false (and nothing run) at
  // the cap, after Shutdown, or when no thread can be had.
  bool TryRun(const std::function<void()>& task);

  // Refuses new tasks, waits for the running ones, joins their threads.
  // Idempotent.
  void Shutdown();

  int running() const;

 private:
  void JoinFinished() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int max_running_;
  mutable absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::list<std::thread> finished_ ABSL_GUARDED_BY(mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_TASK_THREADS_H_
