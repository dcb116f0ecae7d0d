#include "server/map_keeper.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace asyncps {
namespace {

constexpr int kAttempts = 8;

uint64_t EpochOf(const MapReservation& r) { return r.next_map().epoch(); }

std::string Describe(const MapReservation& r) {
  return absl::StrCat("shard ", r.destination_index(), " (", r.destination(),
                      ") moving ", r.slots(), " slots in from shard ",
                      r.source_index(), " for map epoch ", EpochOf(r));
}

// How the move holding `held` ended, if it did: true committed, false
// aborted; FAILED_PRECONDITION while it goes on or cannot be asked.
absl::StatusOr<bool> Ended(const MapReservation& held,
                           const MapReservation& mine,
                           const AskMoveState& ask) {
  if (held.destination_index() == mine.destination_index()) {
    // An earlier try of this shard (group), which moves one at a time: it
    // ended, committed if this shard's map passed its epoch.
    return EpochOf(mine) > EpochOf(held);
  }
  absl::StatusOr<MoveStateResponse> copying = ask(held, /*confirm=*/true);
  if (copying.ok() && copying->copying()) {
    return absl::FailedPreconditionError(
        absl::StrCat("another map change is in progress: ", Describe(held),
                     "; plan again once it ends"));
  }
  absl::StatusOr<MoveStateResponse> state =
      copying.ok() ? ask(held, /*confirm=*/false) : copying.status();
  if (!state.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "another map change holds the run's map: ", Describe(held),
        ", which does not say how it ended (", state.status().message(),
        "); plan again once it answers"));
  }
  return state->committed();
}

// `record` with the move it holds settled as `committed`.
MapRecord Settled(MapRecord record, bool committed) {
  if (committed &&
      record.pending().next_map().epoch() > record.committed().epoch()) {
    *record.mutable_committed() = record.pending().next_map();
  }
  record.clear_pending();
  return record;
}

}  // namespace

absl::Status ReserveMapEpoch(MapRecordStore* store, const MapReservation& r,
                             const AskMoveState& ask) {
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    absl::StatusOr<VersionedMapRecord> now = store->Read();
    if (!now.ok()) return now.status();
    MapRecord record = now->record();
    if (record.has_pending()) {
      absl::StatusOr<bool> committed = Ended(record.pending(), r, ask);
      if (!committed.ok()) return committed.status();
      record = Settled(std::move(record), *committed);
    }
    const uint64_t at = record.committed().epoch();
    if (at >= EpochOf(r)) {
      if (now->record().has_pending()) {
        // Keep what was learnt; the answer is the same either way.
        (void)store->Swap(record, now->version());
      }
      return absl::FailedPreconditionError(
          absl::StrCat("the run's map is at epoch ", at, " already (",
                       store->Where(), "): this move to epoch ", EpochOf(r),
                       " was planned from an older map; plan again"));
    }
    *record.mutable_pending() = r;
    absl::StatusOr<SwapMapRecordResponse> swap =
        store->Swap(record, now->version());
    if (!swap.ok()) return swap.status();
    if (swap->swapped()) return absl::OkStatus();
  }
  return absl::AbortedError(absl::StrCat(
      "the run's map record (", store->Where(),
      ") kept changing while this move tried to take map epoch ", EpochOf(r)));
}

absl::Status SettleMapEpoch(MapRecordStore* store, const MapReservation& r,
                            bool committed) {
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    absl::StatusOr<VersionedMapRecord> now = store->Read();
    if (!now.ok()) return now.status();
    const MapRecord& record = now->record();
    if (!record.has_pending() ||
        record.pending().destination_index() != r.destination_index() ||
        EpochOf(record.pending()) != EpochOf(r)) {
      return absl::OkStatus();  // settled by a reservation that asked
    }
    absl::StatusOr<SwapMapRecordResponse> swap =
        store->Swap(Settled(record, committed), now->version());
    if (!swap.ok()) return swap.status();
    if (swap->swapped()) return absl::OkStatus();
  }
  return absl::AbortedError(absl::StrCat("the run's map record (",
                                         store->Where(), ") kept changing"));
}

}  // namespace asyncps
