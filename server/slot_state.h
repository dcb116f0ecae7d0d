#ifndef ASYNCPS_SERVER_SLOT_STATE_H_
#define ASYNCPS_SERVER_SLOT_STATE_H_

// The state of a set of slots of a slotted run (common/shard_map.h) as
// checkpoint records (proto/checkpoint.proto), for live slot moves
// (proto/slot_moves.proto): the shard the slots leave captures it in
// rounds while it serves them (CaptureSlots), the shard they go to imports
// each round (SlotStateApplier) before the map gives it the slots
// (ShardStore::AdoptMap).
//
// Example:
//
//   absl::StatusOr<SlotSet> slots = SlotSet::Of(source->map(), {3, 17});
//   uint32_t since = 0;                      // round 1: everything
//   SlotStateApplier applier(destination.get());
//   for (int round = 0; round < 3; ++round) {
//     absl::StatusOr<SlotCapture> c = CaptureSlots(source.get(), *slots,
//     since); if (!c.ok()) return c.status(); for (const std::string& r :
//     c->records) {
//       absl::Status s = applier.Apply(r);   // or send them in chunks
//       if (!s.ok()) return s;
//     }
//     since = c->next_since;                 // then: what changed since
//   }
//   // last round with pushes to the slots stopped, then AdoptMap on both.
//
// A round's records: a `tensor` record per tensor and a `table` record per
// table (so that the destination checks it holds the same specs), each
// followed by its slices / rows of the set that changed at or after
// `since` (all of them when 0); a table's rows come in records of at most
// kRowsPerRecord rows, and with since > 0 a `removed` record first lists
// its rows of the set evicted since (store option track_removed_rows).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/shard_map.h"
#include "proto/checkpoint.pb.h"
#include "store/shard_store.h"

namespace asyncps {

// A set of slots of a slotted map; tells whether a slice or a row is in
// one of them. A value type; thread-safe.
class SlotSet {
 public:
  // The slots `slots` of `map`'s slot count; INVALID_ARGUMENT unless `map`
  // is slotted and every slot is below its slot count. Repeats are fine.
  static absl::StatusOr<SlotSet> Of(const ShardMap& map,
                                    absl::Span<const uint32_t> slots);

  int num_slots() const { return static_cast<int>(in_.size()); }
  // How many slots the set holds.
  int size() const { return size_; }
  bool contains(uint32_t slot) const { return slot < in_.size() && in_[slot]; }
  bool HasSlice(absl::string_view tensor, uint32_t index) const {
    return in_[map_.SliceSlot(tensor, index)];
  }
  bool HasRow(ShardMap::TableKey table, uint64_t id) const {
    return in_[map_.RowSlot(table.value, id)];
  }

 private:
  SlotSet(const ShardMap& map, std::vector<bool> in, int size)
      : map_(map), in_(std::move(in)), size_(size) {}

  ShardMap map_;  // for the slot hashes, which depend on the slot count only
  std::vector<bool> in_;
  int size_;
};

// One round's capture.
struct SlotCapture {
  std::vector<std::string> records;  // serialized CheckpointRecords, in order
  uint64_t bytes = 0;                // of the records
  int64_t slices = 0;
  int64_t rows = 0;
  int64_t removed_rows = 0;
  // The change epoch to pass as `since` next round.
  uint32_t next_since = 0;
};

// Captures the state of `slots` on `store` that changed at or after change
// epoch `since` (0 = all of it). The store's change epoch is advanced
// first and the new epoch returned as next_since: a push applied while the
// capture reads is either seen by it or stamped next_since or later
// (store/change_epoch.h; slices and rows are stamped under their locks),
// so the next round, with since = next_since, holds it. Pushes may run
// meanwhile; the round that must be complete runs with the slots' pushes
// stopped. INVALID_ARGUMENT when the set is of another slot count than the
// store's map.
absl::StatusOr<SlotCapture> CaptureSlots(ShardStore* store,
                                         const SlotSet& slots, uint32_t since);

// What applying records did.
struct SlotApplyStats {
  int32_t tensors = 0;  // tensor records (specs checked)
  int32_t tables = 0;   // table records
  int32_t tensors_created = 0;
  int32_t tables_created = 0;
  // Tensors and tables whose newer schedule step was taken from a record.
  int32_t schedules_adopted = 0;
  int64_t slices = 0;
  int64_t rows = 0;
  int64_t removed_rows = 0;
  // The tensors the records named, in order.
  std::vector<std::string> tensor_names;
};

// Applies the records of one slot move, round after round, to the store
// the slots go to: a tensor or table record must name one of the same
// spec here, or one that does not exist yet, created from it
// (ShardStore::RestoreTensor, TableStore::RestoreTable: a standby shard
// that never saw CreateTensor; a tensor only if this shard serves none of
// its slices). A record whose schedule step (store/lr_schedule.h) is newer
// than the one in effect here brings it along, as SetLearningRates would
// (a shard that missed SetLearningRate calls); slices go to
// ShardStore::ImportSlice and rows to TableStore::ImportRows (both refuse
// state of slots this shard serves), removed ids to TableStore::RemoveRows.
// The records of a stream may be split between calls anywhere (a slice or
// rows record belongs to the last tensor or table record before it).
// Not thread-safe.
class SlotStateApplier {
 public:
  // `store` is not owned and outlives the applier. With `slots`, every
  // slice and row must be in one of them (INVALID_ARGUMENT otherwise).
  explicit SlotStateApplier(ShardStore* store, const SlotSet* slots = nullptr);

  // Applies one serialized record. INVALID_ARGUMENT naming what is wrong
  // for a malformed record, one out of place or of a kind a move does not
  // carry, or a slice or rows of the wrong shape or size;
  // FAILED_PRECONDITION naming the tensor or table whose spec differs from
  // this shard's (or a tensor missing here of which this shard serves
  // slices); RESOURCE_EXHAUSTED when the state
  // does not fit in max_parameter_bytes. What was applied before stays.
  absl::Status Apply(absl::string_view record);

  const SlotApplyStats& stats() const { return stats_; }
  // The last tensor or table record applied ("" before any): what the
  // records after it belong to. A replicated destination logs a round in
  // pieces, each starting with the record the one before left off in.
  const std::string& last_spec() const { return last_spec_; }

 private:
  absl::Status StartTensor(const TensorSpec& spec);
  absl::Status CreateTensor(const TensorSpec& spec);
  // Applies the schedule step `moved` carries when it is newer than the
  // one `here` carries (the spec of `name` on this shard).
  absl::Status FollowSchedule(absl::string_view name, const OptimizerSpec& here,
                              const OptimizerSpec& moved);
  absl::Status StartTable(const TableSpec& spec);
  absl::Status AddSlice(const CheckpointSlice& slice);
  absl::Status AddRows(const CheckpointRows& rows);
  absl::Status RemoveRows(const CheckpointRemovedRows& removed);

  ShardStore* const store_;
  const SlotSet* const slots_;  // may be null
  int64_t n_ = 0;               // records applied so far
  // The tensor or table the last spec record named ("" before any).
  std::string tensor_;
  std::string table_;
  ShardMap::TableKey table_key_;
  std::string last_spec_;
  SlotApplyStats stats_;
};

// Applies `records` (all of a round, or of all rounds in order) with one
// SlotStateApplier without a slot check; *stats (if given) says what was
// applied, also on an error.
absl::Status ApplySlotRecords(ShardStore* store,
                              absl::Span<const std::string> records,
                              SlotApplyStats* stats);

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_SLOT_STATE_H_
