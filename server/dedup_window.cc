#include "server/dedup_window.h"

#include <algorithm>

namespace asyncps {

DedupWindow::DedupWindow(int size)
    : size_(std::max(size, 1)), bits_((size_ + 63) / 64, 0) {}

bool DedupWindow::Bit(uint64_t seq) const {
  const uint64_t i = seq % static_cast<uint64_t>(size_);
  return (bits_[i / 64] >> (i % 64)) & 1;
}

void DedupWindow::SetBit(uint64_t seq, bool value) {
  const uint64_t i = seq % static_cast<uint64_t>(size_);
  const uint64_t mask = uint64_t{1} << (i % 64);
  if (value) {
    bits_[i / 64] |= mask;
  } else {
    bits_[i / 64] &= ~mask;
  }
}

DedupWindow::State DedupWindow::Check(uint64_t seq) const {
  if (seq <= base_) return State::kApplied;
  if (in_flight_.contains(seq)) return State::kInFlight;
  if (seq - base_ <= static_cast<uint64_t>(size_) && Bit(seq)) {
    return State::kApplied;
  }
  return State::kNew;
}

void DedupWindow::Begin(uint64_t seq) { in_flight_.insert(seq); }

void DedupWindow::Abort(uint64_t seq) { in_flight_.erase(seq); }

void DedupWindow::Applied(uint64_t seq) {
  in_flight_.erase(seq);
  if (seq <= base_) return;
  const uint64_t size = static_cast<uint64_t>(size_);
  if (seq - base_ > size) {
    // Slide so that seq is the window's last entry; what it passes settles.
    const uint64_t new_base = seq - size;
    if (new_base - base_ >= size) {
      std::fill(bits_.begin(), bits_.end(), 0);
    } else {
      for (uint64_t s = base_ + 1; s <= new_base; ++s) SetBit(s, false);
    }
    base_ = new_base;
  }
  SetBit(seq, true);
  // Advance over the applied prefix.
  while (Bit(base_ + 1)) {
    SetBit(base_ + 1, false);
    ++base_;
  }
}

std::vector<uint64_t> DedupWindow::AppliedAboveBase() const {
  std::vector<uint64_t> out;
  for (uint64_t s = base_ + 1; s <= base_ + static_cast<uint64_t>(size_); ++s) {
    if (Bit(s)) out.push_back(s);
  }
  return out;
}

void DedupWindow::Import(uint64_t base, absl::Span<const uint64_t> applied) {
  std::fill(bits_.begin(), bits_.end(), 0);
  in_flight_.clear();
  base_ = base;
  for (uint64_t s : applied) {
    if (s > base_ && s - base_ <= static_cast<uint64_t>(size_)) SetBit(s, true);
  }
  while (Bit(base_ + 1)) {
    SetBit(base_ + 1, false);
    ++base_;
  }
}

}  // namespace asyncps
