#ifndef ASYNCPS_SERVER_APPLIED_SEQ_SET_H_
#define ASYNCPS_SERVER_APPLIED_SEQ_SET_H_

#include <cstdint>
#include <vector>

#include "proto/asyncps.pb.h"
#include "server/dedup_window.h"

namespace asyncps {

// The push seqs of one worker incarnation that another shard had applied
// when slots of it moved here (its DedupWindow at the move's fence): every
// seq <= base(), and applied() above it. Read-only once taken: a push part
// re-routed from that shard (PushRequest.moved_from) is a duplicate here
// exactly when this set holds the seq it went there under, because a fenced
// shard applies nothing more of the slots it gives away.
//
// Two sets of the same shard are merged by union: a later one holds every
// seq an earlier one does (the window only grows; a seq it slides past
// counts as settled), so the union is the later one.
//
// A value type.
class AppliedSeqSet {
 public:
  AppliedSeqSet() = default;
  // `applied` in any order; seqs <= base are dropped.
  AppliedSeqSet(uint64_t base, std::vector<uint64_t> applied);
  static AppliedSeqSet Of(const DedupWindow& window);
  static AppliedSeqSet FromProto(const AppliedSeqs& proto);
  // `shard` is the shard whose window this was.
  void ToProto(uint32_t shard, AppliedSeqs* out) const;

  bool Holds(uint64_t seq) const;
  void Merge(const AppliedSeqSet& other);

  uint64_t base() const { return base_; }
  const std::vector<uint64_t>& applied() const { return applied_; }

  friend bool operator==(const AppliedSeqSet& a, const AppliedSeqSet& b) {
    return a.base_ == b.base_ && a.applied_ == b.applied_;
  }

 private:
  uint64_t base_ = 0;
  std::vector<uint64_t> applied_;  // ascending, each > base_
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_APPLIED_SEQ_SET_H_
