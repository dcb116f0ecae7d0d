#ifndef ASYNCPS_SERVER_PUSH_DEDUP_H_
#define ASYNCPS_SERVER_PUSH_DEDUP_H_

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

// Makes pushes idempotent. Each push carries (worker_id, incarnation, seq)
// with seq strictly increasing per incarnation; a push whose seq is not
// above the highest one applied for that incarnation is a retry of one
// already applied and is acknowledged without applying it again. A newer
// incarnation (the worker restarted) starts a fresh sequence; an older one
// is a zombie and is refused.
//
// Pushes of one worker are serialized (so a retry racing its original is
// still applied once); pushes of different workers run in parallel.
// Thread-safe.
class PushDedup {
 public:
  // Runs apply() unless this push was seen; returns true if it ran, false
  // for a duplicate. FAILED_PRECONDITION for an older incarnation.
  absl::StatusOr<bool> RunOnce(const WorkerRef& worker, uint64_t seq,
                               absl::FunctionRef<void()> apply);

 private:
  struct Entry {
    absl::Mutex mu;
    uint64_t incarnation ABSL_GUARDED_BY(mu) = 0;
    uint64_t last_seq ABSL_GUARDED_BY(mu) = 0;
    bool any ABSL_GUARDED_BY(mu) = false;
  };

  absl::Mutex mu_;
  // Entries are never removed: one per worker id ever seen.
  absl::flat_hash_map<int32_t, std::unique_ptr<Entry>> entries_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_PUSH_DEDUP_H_
