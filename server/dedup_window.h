#ifndef ASYNCPS_SERVER_DEDUP_WINDOW_H_
#define ASYNCPS_SERVER_DEDUP_WINDOW_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/types/span.h"

namespace asyncps {

// Which pushes of one worker incarnation were applied, by sequence number.
// Pushes may arrive out of order (several in flight, retries), so this keeps
// a window, not a high-water mark: every seq <= base() is settled, and of
// the `size` seqs above it each is known as applied or not. A seq more than
// `size` above the base moves the window up; seqs it passes over that were
// never applied count as settled from then on (only a client that gave up on
// a push could still send one). Pushes being applied are tracked separately,
// so that a retry racing its original waits instead of applying again.
//
// Thread-compatible (the worker registry holds the worker's lock).
class DedupWindow {
 public:
  enum class State { kNew, kApplied, kInFlight };

  // REQUIRES: size > 0.
  explicit DedupWindow(int size = 4096);

  State Check(uint64_t seq) const;
  // REQUIRES: Check(seq) == kNew.
  void Begin(uint64_t seq);
  // The push was not applied (it failed validation): a retry may try again.
  void Abort(uint64_t seq);
  // The push was applied.
  void Applied(uint64_t seq);

  uint64_t base() const { return base_; }
  int size() const { return size_; }
  // Applied seqs above base(), ascending (for checkpoints).
  std::vector<uint64_t> AppliedAboveBase() const;
  // Replaces the state with a checkpoint's; nothing in flight.
  void Import(uint64_t base, absl::Span<const uint64_t> applied);

 private:
  bool Bit(uint64_t seq) const;
  void SetBit(uint64_t seq, bool value);

  int size_;
  uint64_t base_ = 0;
  std::vector<uint64_t>
      bits_;  // bit seq % size_ for seqs in (base_, base_ + size_]
  absl::flat_hash_set<uint64_t> in_flight_;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_DEDUP_WINDOW_H_
