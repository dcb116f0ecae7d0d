#ifndef ASYNCPS_SERVER_MAP_KEEPER_H_
#define ASYNCPS_SERVER_MAP_KEEPER_H_

// One map change at a time in a slotted run. A live move makes the run's
// next map epoch; two moves planned from the same map (two psctl runs, a
// `psctl scale --watch` follower beside an operator, two drains) that share
// no shard would otherwise both commit that epoch with different maps, and
// every client that met both would stop ("shard 0 serves the map of epoch
// 2 but shard 1 another"). So before it copies anything a move's
// destination takes the epoch in the run's map record
// (server/map_record_store.h: in etcd, or at the keeper shard psctl names),
// by compare-and-swap, and gives it back when the move ends:
//
//   - a record held by another destination's move is resolved first: that
//     destination is asked how its move stands (MoveState): still being
//     copied or committed, the new move is refused (FAILED_PRECONDITION,
//     saying which move holds the run's map; nothing copied, the map
//     unchanged); ended, the record takes its outcome and the new move
//     goes on; not answering, refused;
//   - a record held by an earlier try of the same destination (its shard
//     index: one move at a time per shard group) is taken over;
//   - a move whose epoch the record's committed map has reached already is
//     refused (planned from an old map).
//
// The destination still decides how its move ends (server/slot_mover.h);
// the record only lets one move at a time try an epoch, and keeps the map
// of the last committed one.
//
// Example (SlotMover::MoveIn):
//
//   MapReservation r = ...;  // the next map, source, this destination
//   if (absl::Status s = ReserveMapEpoch(store, r, ask); !s.ok()) return s;
//   ... copy, commit or abort ...
//   SettleMapEpoch(store, r, committed);  // errors only logged

#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/slot_moves.pb.h"
#include "server/map_record_store.h"

namespace asyncps {

// MoveState asked of the destination of `r` (its group's primary now).
using AskMoveState = std::function<absl::StatusOr<MoveStateResponse>(
    const MapReservation& r, bool confirm)>;

// Takes r.next_map's epoch for the move `r` (see above). UNAVAILABLE when
// the record cannot be read or written.
absl::Status ReserveMapEpoch(MapRecordStore* store, const MapReservation& r,
                             const AskMoveState& ask);

// Gives the epoch back: the record's committed map becomes r.next_map when
// `committed`; nothing changes when the record no longer holds `r` (the
// next reservation asked and settled it). Errors are for logs: a move left
// unsettled is settled by the next reservation.
absl::Status SettleMapEpoch(MapRecordStore* store, const MapReservation& r,
                            bool committed);

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_MAP_KEEPER_H_
