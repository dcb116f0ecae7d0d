#ifndef ASYNCPS_STORE_CHANGE_EPOCH_H_
#define ASYNCPS_STORE_CHANGE_EPOCH_H_

// Which checkpoint interval a change of a shard's state falls in: what an
// incremental checkpoint (server/checkpoint_delta.h) writes is what changed
// since an epoch.
//
// Every dense slice and sparse table row carries the epoch of its last
// change (a slice: its last applied push; a row: its creation or last use,
// pull or push), stamped with a relaxed atomic store on the request path:
// no lock is taken and nothing is allocated for it. A checkpoint capture
// calls Advance() first (with pushes held back), so that every change
// stamped from then on carries the new epoch; a delta captured later with
// `since` = that epoch holds at least everything changed after the first
// capture began.
//
// Example:
//
//   ChangeEpoch epoch;                     // owned by the ShardStore
//   row_changed.store(epoch.current(), std::memory_order_relaxed);
//   const uint32_t since = epoch.Advance();  // at a capture
//   // ... a later delta holds the rows whose stamp is >= since.
//
// Thread-safe.

#include <atomic>
#include <cstdint>

namespace asyncps {

class ChangeEpoch {
 public:
  // The epoch changes are stamped with now (starts at 1; 0 = never).
  uint32_t current() const { return epoch_.load(std::memory_order_relaxed); }
  // Starts a new epoch and returns it.
  uint32_t Advance() {
    return epoch_.fetch_add(1, std::memory_order_relaxed) + 1;
  }

 private:
  std::atomic<uint32_t> epoch_{1};
};

}  // namespace asyncps

#endif  // ASYNCPS_STORE_CHANGE_EPOCH_H_
