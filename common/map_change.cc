#include "common/map_change.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace asyncps {

absl::StatusOr<ShardMap> WithSlotsMoved(const ShardMap& current,
                                        absl::Span<const uint32_t> slots,
                                        int to) {
  if (!current.slotted()) {
    return absl::InvalidArgumentError(
        absl::StrCat("slots move only in a slotted run (ps_server "
                     "--num_slots); this one serves the ",
                     current.DebugString()));
  }
  if (to < 0 || to >= current.num_shards()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", to, " is not one of the map's ",
                     current.num_shards(), " shards"));
  }
  std::vector<uint16_t> owners(current.owners().begin(),
                               current.owners().end());
  for (const uint32_t s : slots) {
    if (s >= owners.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "slot ", s, " is not one of the map's ", owners.size(), " slots"));
    }
    owners[s] = static_cast<uint16_t>(to);
  }
  return ShardMap::Slotted(current.num_shards(), std::move(owners),
                           current.epoch() + 1);
}

absl::StatusOr<std::vector<uint32_t>> SlotsMoving(const ShardMap& current,
                                                  const ShardMap& next,
                                                  int from, int to) {
  if (!current.slotted() || !next.slotted() ||
      current.num_slots() != next.num_slots() ||
      current.num_shards() != next.num_shards()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a move changes a slotted map's owners only; this shard "
        "serves the ",
        current.DebugString(), ", the move makes the ", next.DebugString()));
  }
  if (next.epoch() != current.epoch() + 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a move makes the map one epoch on: this shard serves epoch ",
        current.epoch(), ", the move makes epoch ", next.epoch()));
  }
  if (from == to) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", from, " cannot move slots to itself"));
  }
  std::vector<uint32_t> moving;
  const absl::Span<const uint16_t> a = current.owners();
  const absl::Span<const uint16_t> b = next.owners();
  for (size_t s = 0; s < a.size(); ++s) {
    if (a[s] == b[s]) continue;
    if (a[s] != from || b[s] != to) {
      return absl::FailedPreconditionError(
          absl::StrCat("slot ", s, " goes from shard ", a[s], " to shard ",
                       b[s], "; this move takes slots from shard ", from,
                       " to shard ", to, " only"));
    }
    moving.push_back(static_cast<uint32_t>(s));
  }
  if (moving.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the map of epoch ", next.epoch(),
                     " moves no slot from shard ", from, " to shard ", to));
  }
  return moving;
}

absl::Status CheckAdoptable(const ShardMap& current, const ShardMap& next,
                            int shard, bool may_gain) {
  if (!current.slotted()) {
    return absl::FailedPreconditionError(
        absl::StrCat("this shard serves the ", current.DebugString(),
                     ": maps change only in a slotted run (--num_slots)"));
  }
  if (!next.slotted() || next.num_shards() != current.num_shards() ||
      next.num_slots() != current.num_slots()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ", next.DebugString(), " is not a map of this run (",
        current.num_slots(), " slots over ", current.num_shards(), " shards)"));
  }
  if (next.epoch() < current.epoch() ||
      (next.epoch() == current.epoch() && next != current)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the map of epoch ", next.epoch(), " is not newer than the ",
        current.DebugString(), " this shard serves"));
  }
  if (may_gain) return absl::OkStatus();
  const absl::Span<const uint16_t> before = current.owners();
  const absl::Span<const uint16_t> after = next.owners();
  for (size_t s = 0; s < before.size(); ++s) {
    if (before[s] != shard && after[s] == shard) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the map of epoch ", next.epoch(), " gives slot ", s, " to shard ",
          shard, " instead of shard ", before[s],
          ": a shard gains slots only by a move (MoveSlots), which copies "
          "their state (when this shard's files predate a move into it, "
          "that state is gone: psctl adopt --remake_lost makes those slices "
          "anew)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace asyncps
