// One map change at a time (server/map_keeper.h) over the keeper shard's
// in-memory record: a move takes the run's next epoch, another move planned
// from the same map is refused while the first goes on, is let through
// once the first ended without a commit, and refused as planned from an
// old map once it committed; a holder that does not answer blocks; an
// earlier try of the same destination is taken over; settling records the
// committed map only for the move the record holds.
#include "server/map_keeper.h"

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/map_change.h"
#include "common/shard_map.h"
#include "common/shard_map_proto.h"
#include "server/map_record_store.h"
#include "tests/testing/require_ok.h"

namespace asyncps {
namespace {

// A move of `slots` to shard `to`, planned from `from_map`.
MapReservation Move(const ShardMap& from_map, std::vector<uint32_t> slots,
                    int from, int to) {
  MapReservation r;
  ShardMapToProto(*WithSlotsMoved(from_map, slots, to), r.mutable_next_map());
  r.set_source_index(from);
  r.set_destination_index(to);
  r.set_destination("127.0.0.1:" + std::to_string(7000 + to));
  r.set_slots(static_cast<uint32_t>(slots.size()));
  return r;
}

// What the holder of the record answers to MoveState, and what was asked.
struct FakeHolder {
  absl::Status error;              // not OK: it does not answer
  bool copying = false;            // to confirm
  bool committed = false;          // to the question that decides
  std::vector<std::string> asked;  // "<destination> confirm|decide"

  AskMoveState Ask() {
    return [this](const MapReservation& held,
                  bool confirm) -> absl::StatusOr<MoveStateResponse> {
      asked.push_back(held.destination() + (confirm ? " confirm" : " decide"));
      if (!error.ok()) return error;
      MoveStateResponse r;
      r.set_copying(confirm && copying);
      r.set_committed(!confirm && committed);
      return r;
    };
  }
};

MapRecord Record(LocalMapRecord& store) { return store.Read()->record(); }

TEST_CASE(
    "a move takes the next epoch; another one planned from the same "
    "map is refused while it is copied",
    "[slots][keeper]") {
  LocalMapRecord store("shard 0");
  FakeHolder holder;
  const ShardMap even = *ShardMap::EvenSlots(4, 16);
  const MapReservation a = Move(even, {0, 4}, 0, 1);
  const MapReservation b = Move(even, {2, 6}, 2, 3);
  REQUIRE_OK(ReserveMapEpoch(&store, a, holder.Ask()));
  CHECK(holder.asked.empty());  // nothing held before
  CHECK(Record(store).pending().destination_index() == 1);
  CHECK(Record(store).pending().next_map().epoch() == 2);

  holder.copying = true;
  const absl::Status refused = ReserveMapEpoch(&store, b, holder.Ask());
  INFO(refused.ToString());
  REQUIRE(absl::IsFailedPrecondition(refused));
  CHECK(absl::StrContains(refused.message(), "another map change"));
  CHECK(absl::StrContains(refused.message(), "shard 1"));
  CHECK(holder.asked == std::vector<std::string>{"127.0.0.1:7001 confirm"});
  // The record still holds the first move.
  CHECK(Record(store).pending().destination_index() == 1);

  SECTION("the first aborted: the second goes on") {
    holder.copying = false;
    holder.committed = false;
    REQUIRE_OK(ReserveMapEpoch(&store, b, holder.Ask()));
    CHECK(Record(store).pending().destination_index() == 3);
    CHECK(!Record(store).has_committed());
    REQUIRE_OK(SettleMapEpoch(&store, b, /*committed=*/true));
    CHECK(!Record(store).has_pending());
    CHECK(Record(store).committed().epoch() == 2);
    CHECK(*ShardMapFromProto(Record(store).committed()) ==
          *ShardMapFromProto(b.next_map()));
    // The first, settled late, changes nothing now.
    REQUIRE_OK(SettleMapEpoch(&store, a, /*committed=*/false));
    CHECK(*ShardMapFromProto(Record(store).committed()) ==
          *ShardMapFromProto(b.next_map()));
  }
  SECTION("the first committed: the second was planned from an old map") {
    holder.copying = false;
    holder.committed = true;
    const absl::Status old = ReserveMapEpoch(&store, b, holder.Ask());
    INFO(old.ToString());
    REQUIRE(absl::IsFailedPrecondition(old));
    CHECK(absl::StrContains(old.message(), "at epoch 2 already"));
    // What the question learnt is kept: the first's map is the run's.
    CHECK(!Record(store).has_pending());
    CHECK(*ShardMapFromProto(Record(store).committed()) ==
          *ShardMapFromProto(a.next_map()));
    // Planned again from it, the second takes epoch 3.
    const MapReservation b3 =
        Move(*ShardMapFromProto(a.next_map()), {2, 6}, 2, 3);
    REQUIRE_OK(ReserveMapEpoch(&store, b3, holder.Ask()));
    CHECK(Record(store).pending().next_map().epoch() == 3);
  }
  SECTION("a holder that does not answer keeps the epoch") {
    holder.error = absl::UnavailableError("connection refused");
    const absl::Status blocked = ReserveMapEpoch(&store, b, holder.Ask());
    INFO(blocked.ToString());
    REQUIRE(absl::IsFailedPrecondition(blocked));
    CHECK(absl::StrContains(blocked.message(), "connection refused"));
    CHECK(Record(store).pending().destination_index() == 1);
  }
}

TEST_CASE(
    "an earlier try of the same destination is taken over without "
    "asking",
    "[slots][keeper]") {
  LocalMapRecord store("shard 0");
  FakeHolder holder;
  const ShardMap even = *ShardMap::EvenSlots(2, 8);
  const MapReservation first = Move(even, {0}, 0, 1);
  REQUIRE_OK(ReserveMapEpoch(&store, first, holder.Ask()));
  // Its end was never recorded (the destination restarted, say); the same
  // move again.
  REQUIRE_OK(ReserveMapEpoch(&store, first, holder.Ask()));
  CHECK(holder.asked.empty());
  // It committed this time; the next move of the same destination.
  REQUIRE_OK(SettleMapEpoch(&store, first, /*committed=*/true));
  const MapReservation next =
      Move(*ShardMapFromProto(first.next_map()), {2}, 0, 1);
  REQUIRE_OK(ReserveMapEpoch(&store, next, holder.Ask()));
  CHECK(Record(store).committed().epoch() == 2);
  CHECK(Record(store).pending().next_map().epoch() == 3);
}

TEST_CASE("the record is written only at the version it was read at",
          "[slots][keeper]") {
  LocalMapRecord store("shard 0");
  CHECK(store.Read()->version() == 0);
  MapRecord r;
  r.mutable_pending()->set_destination("a");
  absl::StatusOr<SwapMapRecordResponse> won = store.Swap(r, 0);
  REQUIRE_OK(won.status());
  CHECK(won->swapped());
  CHECK(won->current().version() == 1);
  MapRecord other;
  other.mutable_pending()->set_destination("b");
  absl::StatusOr<SwapMapRecordResponse> lost = store.Swap(other, 0);
  REQUIRE_OK(lost.status());
  CHECK(!lost->swapped());
  CHECK(lost->current().record().pending().destination() == "a");
  CHECK(store.Read()->version() == 1);
}

TEST_CASE(
    "a keeper's record file outlives the process; a bad one stops "
    "map changes, naming it",
    "[slots][keeper]") {
  const std::string dir = std::getenv("TEST_TMPDIR");
  const std::string path = dir + "/shard-0-of-4.maprecord";
  std::remove(path.c_str());
  const ShardMap even = *ShardMap::EvenSlots(4, 16);
  const MapReservation a = Move(even, {0, 4}, 0, 1);
  {
    LocalMapRecord keeper("shard 0", path);
    FakeHolder holder;
    REQUIRE_OK(ReserveMapEpoch(&keeper, a, holder.Ask()));
  }
  // A new process on the same files: the move still holds the epoch.
  LocalMapRecord again("shard 0", path);
  absl::StatusOr<VersionedMapRecord> read = again.Read();
  REQUIRE_OK(read.status());
  CHECK(read->version() == 1);
  CHECK(read->record().pending().destination_index() == 1);
  FakeHolder holder;
  holder.copying = true;
  const absl::Status refused =
      ReserveMapEpoch(&again, Move(even, {2, 6}, 2, 3), holder.Ask());
  CHECK(absl::IsFailedPrecondition(refused));
  REQUIRE_OK(SettleMapEpoch(&again, a, /*committed=*/true));
  CHECK(LocalMapRecord("shard 0", path).Read()->record().committed().epoch() ==
        2);

  // A file that is not a map record: every read and write refused.
  { std::ofstream(path, std::ios::trunc) << "not a record file"; }
  LocalMapRecord broken("shard 0", path);
  const absl::StatusOr<VersionedMapRecord> bad = broken.Read();
  INFO(bad.status().ToString());
  CHECK(absl::IsFailedPrecondition(bad.status()));
  CHECK(absl::StrContains(bad.status().message(), "maprecord"));
  CHECK(absl::IsFailedPrecondition(broken.Swap(MapRecord(), 0).status()));

  // A directory that cannot be written: the write is refused, the record
  // in memory unchanged.
  LocalMapRecord unwritable("shard 0", dir + "/no/such/dir/x.maprecord");
  MapRecord r;
  r.mutable_pending()->set_destination("a");
  CHECK(absl::IsUnavailable(unwritable.Swap(r, 0).status()));
  CHECK(unwritable.Read()->version() == 0);
}

}  // namespace
}  // namespace asyncps
