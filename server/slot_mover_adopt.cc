// Any shard: adopting a newer map, handed by psctl adopt (the AdoptMap RPC)
// or read from the run's map record in etcd by a shard behind it
// (SlotMover::NewerMapRouted).
#include <string>

#include "absl/strings/str_cat.h"
#include "common/map_change.h"
#include "common/shard_map_proto.h"
#include "server/slot_mover.h"

namespace asyncps {

absl::StatusOr<ShardMap> SlotMover::Adopt(const ShardMap& map,
                                          bool remake_lost) {
  if (absl::Status s = CheckPrimary(); !s.ok()) return s;
  {
    absl::MutexLock l(&mu_);
    if (moving_in_ || leaving_.has_value()) {
      return absl::UnavailableError(
          "a move of this shard's slots is in progress; retry");
    }
  }
  const ShardMap current = c_->store->map();
  absl::Status s =
      CheckAdoptable(current, map, c_->shard_index, /*may_gain=*/remake_lost);
  if (!s.ok()) return s;
  if (map == current) return current;
  int lost = 0, gained = 0;
  for (int slot = 0; slot < map.num_slots(); ++slot) {
    const bool before = current.owners()[slot] == c_->shard_index;
    const bool after = map.owners()[slot] == c_->shard_index;
    lost += before && !after;
    gained += after && !before;
  }
  if (lost > 0) {
    c_->logger->warn(
        "the map of epoch {} gives {} slots of this shard to others (a move "
        "committed while this shard ran on older files): dropping them",
        map.epoch(), lost);
  }
  if (gained > 0) {
    c_->logger->error(
        "the run's map of epoch {} gives this shard {} slots whose state it "
        "does not hold (moved here after its files were written, and every "
        "replica that held them is gone): their slices are made anew as "
        "when created, and the updates they had are lost",
        map.epoch(), gained);
  }
  MoveStep step = MoveStepTo(map);
  step.mutable_adopted()->set_remake_lost(gained > 0);
  s = Step(
      std::move(step), [&](const MoveStep& st) { return AdoptBody(st); },
      /*acked=*/false);
  if (!s.ok()) return s;
  c_->logger->info("serving the {} (was epoch {})", map.DebugString(),
                   current.epoch());
  return map;
}

void SlotMover::NewerMapRouted() {
  if (o_.run_map_record == nullptr || catch_up_wanted_.exchange(true)) return;
  absl::MutexLock l(&mu_);
  ++wakes_;
  watcher_cv_.notify_all();
}

void SlotMover::CatchUpWithRun() {
  absl::StatusOr<VersionedMapRecord> now = o_.run_map_record->Read();
  if (!now.ok()) {
    return CatchUpFailed(absl::StrCat("cannot read the run's map in ",
                                      o_.run_map_record->Where(), ": ",
                                      now.status().ToString()));
  }
  // Before the first committed move the shards serve the map they started
  // with; a newer epoch held by a move in progress is that move's to end.
  if (!now->record().has_committed()) return;
  absl::StatusOr<ShardMap> map = ShardMapFromProto(now->record().committed());
  if (!map.ok()) {
    return CatchUpFailed(absl::StrCat("the run's map in ",
                                      o_.run_map_record->Where(), ": ",
                                      map.status().ToString()));
  }
  const uint64_t served = c_->store->map_epoch();
  if (map->epoch() <= served) return;
  // Behind the run: looked at again in a moment, until it is not (a
  // replica that is no primary yet, a move of this shard under way).
  catch_up_wanted_.store(true);
  if (c_->log != nullptr && !c_->log->primary()) return;  // its primary's
  absl::StatusOr<ShardMap> adopted = Adopt(*map, /*remake_lost=*/true);
  if (!adopted.ok()) {
    return CatchUpFailed(
        absl::StrCat("serving map epoch ", served, " while the run's map in ",
                     o_.run_map_record->Where(), " is at epoch ", map->epoch(),
                     "; cannot adopt it yet: ", adopted.status().ToString()));
  }
  c_->logger->warn(
      "caught up with the run's map in {}: epoch {}, where this shard served "
      "epoch {} (it started on older files, or missed the map's hand-out)",
      o_.run_map_record->Where(), map->epoch(), served);
}

void SlotMover::CatchUpFailed(const std::string& why) {
  const absl::Time now = Now();
  if (now - last_catch_up_warning_ < absl::Seconds(10)) {
    c_->logger->debug("{}", why);
    return;
  }
  last_catch_up_warning_ = now;
  c_->logger->warn("{} (tried again soon)", why);
}

}  // namespace asyncps
