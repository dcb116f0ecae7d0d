#include "common/executor.h"

#include <algorithm>
#include <utility>

namespace asyncps {

Executor::Executor(int threads) {
  for (int i = 0; i < std::max(threads, 1); ++i) {
    threads_.emplace_back([this] { Loop(); });
  }
}

Executor::~Executor() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void Executor::Run(std::function<void()> fn) {
  {
    absl::MutexLock l(&mu_);
    if (!stopping_) {
      queue_.push_back(std::move(fn));
      return;
    }
  }
  fn();
}

void Executor::Loop() {
  for (;;) {
    std::function<void()> fn;
    {
      absl::MutexLock l(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, and nothing left
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    fn();
  }
}

}  // namespace asyncps
