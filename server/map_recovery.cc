#include "server/map_recovery.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/clock.h"

namespace asyncps {

namespace {

absl::Time Now() { return Clock::Monotonic()->Now(); }

}  // namespace

MapRecovery::MapRecovery(EtcdClient* etcd, MapStore* maps,
                         const std::string& prefix, std::string self,
                         std::shared_ptr<spdlog::logger> logger,
                         absl::Duration settle)
    : etcd_(etcd),
      maps_(maps),
      offers_(absl::StrCat(prefix, "/recovery/")),
      self_(std::move(self)),
      logger_(std::move(logger)),
      settle_(settle) {}

bool MapRecovery::Lost(const absl::StatusOr<MapStore::Read>& read) const {
  if (!read.ok()) {
    return absl::IsNotFound(read.status()) || absl::IsDataLoss(read.status());
  }
  return read->map.epoch() < maps_->newest_epoch();
}

absl::Status MapRecovery::Step(const absl::StatusOr<MapStore::Read>& read,
                               int64_t lease_id) {
  const ShardMapRecord newest = maps_->newest();
  const bool first = lost_since_ == absl::InfiniteFuture();
  if (first) {
    lost_since_ = Now();
    logger_->warn(
        "the run's shard map at {} is {} (etcd lost its data?): this replica "
        "offers the newest map it saw ({}); in {} the newest offered is put "
        "back",
        maps_->key(),
        read.ok()                         ? "older than one it saw"
        : absl::IsDataLoss(read.status()) ? "no shard map"
                                          : "gone",
        newest.epoch() > 0 ? absl::StrCat("epoch ", newest.epoch())
                           : std::string("none"),
        absl::FormatDuration(settle_));
  }
  if (newest.epoch() > 0 && offered_under_ != lease_id) {
    absl::StatusOr<int64_t> put =
        etcd_->Put(offers_ + self_, newest.SerializeAsString(), lease_id);
    if (!put.ok()) return put.status();
    offered_under_ = lease_id;
  }
  // The first look only offers; a later one writes once `settle` passed.
  if (first || Now() - lost_since_ < settle_) return absl::OkStatus();
  absl::StatusOr<EtcdClient::Listing> offers = etcd_->List(offers_);
  if (!offers.ok()) return offers.status();
  ShardMapRecord best = newest;
  for (const EtcdKeyValue& kv : offers->kvs) {
    ShardMapRecord offered;
    if (offered.ParseFromString(kv.value) && offered.epoch() > best.epoch()) {
      best = std::move(offered);
    }
  }
  if (best.epoch() == 0) return absl::OkStatus();  // nothing to put back
  // What is at the key now: put back by another replica already (and
  // maybe changed since), or still to be written over.
  absl::StatusOr<std::optional<EtcdKeyValue>> now = etcd_->Get(maps_->key());
  if (!now.ok()) return now.status();
  int64_t at_revision = 0;
  if (now->has_value()) {
    ShardMapRecord there;
    if (there.ParseFromString((*now)->value) && MapStore::Check(there).ok() &&
        there.epoch() >= best.epoch()) {
      return absl::OkStatus();
    }
    at_revision = (*now)->mod_revision;
  }
  const uint64_t from = best.epoch();
  best.set_epoch(from + 1);
  absl::StatusOr<bool> put = maps_->Replace(best, at_revision);
  if (!put.ok()) return put.status();
  if (*put) {
    logger_->warn(
        "put the run's shard map back at {}: epoch {}, the newest of {} "
        "offered by live replicas (epoch {})",
        maps_->key(), best.epoch(), offers->kvs.size(), from);
  }
  return absl::OkStatus();
}

void MapRecovery::Found() {
  if (lost_since_ == absl::InfiniteFuture()) return;
  if (offered_under_ != 0) (void)etcd_->Delete(offers_ + self_);
  logger_->info("the run's shard map is back (epoch {})",
                maps_->newest().epoch());
  lost_since_ = absl::InfiniteFuture();
  offered_under_ = 0;
}

}  // namespace asyncps
