#include "server/applied_seq_set.h"

#include <algorithm>
#include <iterator>
#include <utility>

namespace asyncps {

AppliedSeqSet::AppliedSeqSet(uint64_t base, std::vector<uint64_t> applied)
    : base_(base), applied_(std::move(applied)) {
  std::sort(applied_.begin(), applied_.end());
  applied_.erase(std::unique(applied_.begin(), applied_.end()), applied_.end());
  applied_.erase(applied_.begin(),
                 std::upper_bound(applied_.begin(), applied_.end(), base_));
}

AppliedSeqSet AppliedSeqSet::Of(const DedupWindow& window) {
  return AppliedSeqSet(window.base(), window.AppliedAboveBase());
}

AppliedSeqSet AppliedSeqSet::FromProto(const AppliedSeqs& proto) {
  return AppliedSeqSet(
      proto.base(),
      std::vector<uint64_t>(proto.applied().begin(), proto.applied().end()));
}

void AppliedSeqSet::ToProto(uint32_t shard, AppliedSeqs* out) const {
  out->set_shard(shard);
  out->set_base(base_);
  for (uint64_t seq : applied_) out->add_applied(seq);
}

bool AppliedSeqSet::Holds(uint64_t seq) const {
  return seq <= base_ ||
         std::binary_search(applied_.begin(), applied_.end(), seq);
}

void AppliedSeqSet::Merge(const AppliedSeqSet& other) {
  std::vector<uint64_t> all;
  all.reserve(applied_.size() + other.applied_.size());
  std::set_union(applied_.begin(), applied_.end(), other.applied_.begin(),
                 other.applied_.end(), std::back_inserter(all));
  *this = AppliedSeqSet(std::max(base_, other.base_), std::move(all));
}

}  // namespace asyncps
