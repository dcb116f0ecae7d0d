// A shard behind the run's map catches up with the map record in etcd
// (SlotMover::NewerMapRouted).
#include <string>

#include "absl/strings/str_cat.h"
#include "common/shard_map_proto.h"
#include "server/slot_mover.h"

namespace asyncps {

void SlotMover::NewerMapRouted() {
  if (o_.run_map_record == nullptr || catch_up_wanted_.exchange(true)) return;
  absl::MutexLock l(&mu_);  // letting it go wakes the watcher
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
  const absl::Time now = absl::Now();
  if (now - last_catch_up_warning_ < absl::Seconds(10)) {
    c_->logger->debug("{}", why);
    return;
  }
  last_catch_up_warning_ = now;
  c_->logger->warn("{} (tried again soon)", why);
}

}  // namespace asyncps
