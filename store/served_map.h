#ifndef ASYNCPS_STORE_SERVED_MAP_H_
#define ASYNCPS_STORE_SERVED_MAP_H_

// The shard map (common/shard_map.h) a shard serves now. A ShardStore owns
// one and shares it with its TableStore and every SparseTable, so that all
// of them answer "is this key mine" by the same map, and a live slot move
// changes it in one place (ShardStore::AdoptMap).
//
// Example:
//
//   auto served = std::make_shared<ServedMap>(*ShardMap::EvenSlots(2, 64));
//   const ShardMap map = served->get();  // a consistent copy for one request
//   if (map.RowHome(key, id) != shard_index) { ... }  // not ours
//   served->Set(next);                    // the owner, changing maps
//
// Reading takes a shared lock and copies a shared_ptr: no exclusive lock on
// the request path. Thread-safe.

#include <atomic>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/shard_map.h"

namespace asyncps {

class ServedMap {
 public:
  explicit ServedMap(ShardMap map) : map_(map), epoch_(map.epoch()) {}
  ServedMap(const ServedMap&) = delete;
  ServedMap& operator=(const ServedMap&) = delete;

  // The map served now.
  ShardMap get() const {
    absl::ReaderMutexLock l(&mu_);
    return map_;
  }
  // Its epoch, without a lock.
  uint64_t epoch() const { return epoch_.load(std::memory_order_acquire); }

  // Serves `next` from now on. The caller (ShardStore::AdoptMap) checked
  // that it may.
  void Set(const ShardMap& next) {
    absl::MutexLock l(&mu_);
    map_ = next;
    epoch_.store(next.epoch(), std::memory_order_release);
  }

 private:
  mutable absl::Mutex mu_;
  ShardMap map_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> epoch_;
};

}  // namespace asyncps

#endif  // ASYNCPS_STORE_SERVED_MAP_H_
