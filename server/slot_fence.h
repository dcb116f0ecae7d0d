#ifndef ASYNCPS_SERVER_SLOT_FENCE_H_
#define ASYNCPS_SERVER_SLOT_FENCE_H_

// Whether a shard serves its data now. A shard whose slots are leaving it
// (server/slot_mover.h) is fenced between the last copy of their state and
// the end of the move: it answers every pull and push UNAVAILABLE, which
// clients retry after a short backoff, so that nothing is read or applied
// that the destination would not have. The flag is set and cleared with the
// push gate closed (server/push_gate.h), so a push that holds a pass sees
// one value from its check to its commit.
//
// Example (the data path):
//
//   if (context.fence != nullptr && context.fence->fenced()) {
//     return context.fence->Refusal();  // UNAVAILABLE, retried
//   }
//
// Thread-safe.

#include <atomic>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/shard_map.h"

namespace asyncps {

class SlotFence {
 public:
  // One relaxed load: the data path asks on every request.
  bool fenced() const { return fenced_.load(std::memory_order_acquire); }

  // UNAVAILABLE naming the move (why the shard does not serve now).
  absl::Status Refusal() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    return absl::UnavailableError(why_);
  }

  // REQUIRES: the push gate is closed.
  void Raise(const std::string& why) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    why_ = why;
    shown_.reset();
    fenced_.store(true, std::memory_order_release);
  }
  // Raise, by a replicated destination whose commit of a move waits for
  // its backups: until Lower, the answers that carry a map (Status,
  // ListTensors, CreateTensor) show `before`, the map from before the
  // commit, so that no client learns a map that a backup taking over
  // without the commit would undo.
  void RaiseCommitting(const std::string& why, ShardMap before)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    why_ = why;
    shown_ = std::move(before);
    fenced_.store(true, std::memory_order_release);
  }
  void Lower() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    shown_.reset();
    fenced_.store(false, std::memory_order_release);
  }

  // The map to show clients: `served`, or the one RaiseCommitting holds.
  ShardMap Shown(const ShardMap& served) const ABSL_LOCKS_EXCLUDED(mu_) {
    if (!fenced()) return served;
    absl::MutexLock l(&mu_);
    return shown_.has_value() ? *shown_ : served;
  }

 private:
  std::atomic<bool> fenced_{false};
  mutable absl::Mutex mu_;
  std::string why_ ABSL_GUARDED_BY(mu_);
  std::optional<ShardMap> shown_ ABSL_GUARDED_BY(mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_SLOT_FENCE_H_
