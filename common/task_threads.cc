#include "common/task_threads.h"

#include <system_error>
#include <utility>

namespace asyncps {

TaskThreads::TaskThreads(int max_running) : max_running_(max_running) {}

TaskThreads::~TaskThreads() { Shutdown(); }

bool TaskThreads::TryRun(const std::function<void()>& task) {
  absl::MutexLock l(&mu_);
  JoinFinished();
  if (shut_down_ || running_ >= max_running_) return false;
  const uint64_t id = next_id_++;
  try {
    // The thread waits for mu_ before it files itself as finished, so it
    // is in threads_ by then.
    threads_[id] = std::thread([this, id, run = task]() mutable {
      run();
      run = nullptr;
      absl::MutexLock done(&mu_);
      --running_;
      auto it = threads_.find(id);
      finished_.push_back(std::move(it->second));
      threads_.erase(it);
    });
  } catch (const std::system_error&) {
    return false;
  }
  ++running_;
  return true;
}

void TaskThreads::Shutdown() {
  absl::MutexLock l(&mu_);
  shut_down_ = true;
  mu_.Await(absl::Condition(
      +[](int* running) { return *running == 0; }, &running_));
  JoinFinished();
}

int TaskThreads::running() const {
  absl::MutexLock l(&mu_);
  return running_;
}

void TaskThreads::JoinFinished() {
  for (std::thread& t : finished_) t.join();
  finished_.clear();
}

}  // namespace asyncps
