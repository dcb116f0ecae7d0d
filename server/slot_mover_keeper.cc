// The map record side of a move's destination (server/map_keeper.h): the
// run's next epoch is taken before anything is copied and given back when
// the move ends; and this shard's own record, served when psctl names it
// the run's keeper.
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/map_keeper.h"
#include "server/slot_mover.h"

namespace asyncps {

MapReservation SlotMover::ReservationOf(const MoveSlotsRequest& request,
                                        size_t slots) const {
  MapReservation r;
  *r.mutable_next_map() = request.next_map();
  r.set_source_index(request.source_index());
  r.set_destination_index(c_->shard_index);
  r.set_destination(request.destination());
  r.set_slots(static_cast<uint32_t>(slots));
  return r;
}

absl::Status SlotMover::TakeEpoch(MapRecordStore* record,
                                  const MapReservation& r) {
  absl::Status reserved = ReserveMapEpoch(
      record, r, [this](const MapReservation& held, bool confirm) {
        return AskHolder(held, confirm);
      });
  if (!reserved.ok()) {
    // Nothing was copied: the move is forgotten (its epoch may be tried
    // again at once).
    const uint64_t epoch = r.next_map().epoch();
    absl::MutexLock l(&mu_);
    moving_in_ = false;
    incoming_.erase(epoch);
    last_word_.erase(epoch);
  }
  return reserved;
}

MapRecordStore* SlotMover::MapRecordFor(
    const MoveSlotsRequest& request, std::unique_ptr<MapRecordStore>* remote) {
  if (o_.run_map_record != nullptr) return o_.run_map_record.get();
  if (request.keeper().empty() || request.keeper() == request.destination()) {
    return &own_record_;
  }
  *remote = std::make_unique<RemoteMapRecord>(request.keeper(), c_->run_id,
                                              o_.security);
  return remote->get();
}

absl::StatusOr<MapRecordStore*> SlotMover::KeeperRecord(
    const std::string& run_id) {
  if (run_id != c_->run_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("this shard keeps the map record of run '", c_->run_id,
                     "', not of run '", run_id, "'"));
  }
  return &own_record_;
}

absl::StatusOr<MoveStateResponse> SlotMover::AskHolder(
    const MapReservation& held, bool confirm) const {
  std::string destination = held.destination();
  if (o_.primary_of) {
    absl::StatusOr<std::string> primary =
        o_.primary_of(held.destination_index());
    if (primary.ok() && !primary->empty()) destination = *std::move(primary);
  }
  return CallMoveState(destination, held.next_map().epoch(), confirm);
}

void SlotMover::Settle(MapRecordStore* record, const MapReservation& r,
                       bool committed) {
  if (absl::Status s = SettleMapEpoch(record, r, committed); !s.ok()) {
    c_->logger->warn(
        "could not record in {} that the move to map epoch {} {} ({}); the "
        "next move asks this shard",
        record->Where(), r.next_map().epoch(),
        committed ? "committed" : "was aborted", s.ToString());
  }
}

}  // namespace asyncps
