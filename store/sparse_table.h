#ifndef ASYNCPS_STORE_SPARSE_TABLE_H_
#define ASYNCPS_STORE_SPARSE_TABLE_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/row_initializer.h"
#include "common/shard_map.h"
#include "proto/asyncps.pb.h"
#include "store/admission_filter.h"
#include "store/change_epoch.h"
#include "store/lr_schedule.h"
#include "store/optimizer.h"
#include "store/row_eviction.h"
#include "store/served_map.h"
#include "store/staleness_rule.h"

namespace asyncps {

// Largest embedding dimension of a table.
inline constexpr int kMaxTableDim = 65536;

// The rows of one sparse embedding table that live on one shard.
//
// Storage: rows sit in chunks of kChunkRows rows (values and optimizer state
// of a row side by side, then arrays of ids, versions and last-use clocks),
// found through an open-addressing hash index (linear probing over 16-byte
// slots of id and row number). No allocation per row: chunks are allocated
// as rows are created, and rows that are evicted are reused. Rows never move
// once created, so a row found by a request stays where it is until the
// request ends (eviction excepted, which the owner keeps apart from
// requests: see TableStore).
//
// Concurrency: the rows are split into kPartitions partitions by a hash of
// the id, each with its own lock, index and chunks, so requests of different
// workers proceed in parallel; a request visits the partitions one at a
// time. Thread-safe.
//
// The memory a row counts against the shard's --max_parameter_bytes is
// row_bytes(); the owner reserves it before rows are created (Batch) and
// gets it back when rows are evicted. The table's own memory is
// fixed_bytes() (with the admission sketches, store/admission_filter.h).
//
// Admission (TableSpec.admission): pulls create no rows, and a push gives a
// row to an id only when its count in the partition's sketch admits it;
// the gradients of the others are dropped (PushCounts::refused_admission).
// Eviction under the cap (TableSpec.eviction, store/row_eviction.h): the
// owner asks EvictionThreshold for the score of the rows to go and has
// EvictPartition remove them, one partition at a time.
//
// Changes for incremental checkpoints (store/change_epoch.h): every row
// carries the epoch of its creation or last use (pull or push), stamped
// under the lock the request holds anyway; with `track_removed`, the ids of
// evicted rows are remembered with their epochs until ForgetRemovedBefore.
class SparseTable {
 public:
  static constexpr int kPartitionBits = 4;
  static constexpr int kPartitions = 1 << kPartitionBits;
  static constexpr int kChunkShift = 8;
  static constexpr uint32_t kChunkRows = 1u << kChunkShift;

  // Bytes per row besides values and optimizer state: id, version, clock,
  // duplicate tag and (about) two index slots.
  static constexpr uint64_t kRowOverheadBytes = 64;
  // Bytes of an empty table (partitions, their first index and chunk list).
  static constexpr uint64_t kTableOverheadBytes = 16 << 10;

  // The positions of one request's ids, grouped by partition, and the row
  // each id was found at. Filled by Find; used by Read and Apply of the
  // same request on the same table.
  struct Batch {
    static constexpr uint32_t kNoRow = ~0u;
    std::vector<uint32_t> order;                  // positions by partition
    std::array<uint32_t, kPartitions + 1> begin;  // of each partition in order
    std::vector<uint32_t> rows;                   // per position, or kNoRow
    uint64_t missing = 0;                         // positions with kNoRow
    // Most rows a push of this batch may create (Admissible; else missing).
    uint64_t may_create = ~uint64_t{0};
  };

  // One row as Export hands it out; the pointers are valid during the call.
  struct RowView {
    int dim = 0;
    int state_floats = 0;
    uint64_t id = 0;
    uint64_t version = 0;
    int64_t touched = 0;
    const float* values = nullptr;  // dim
    const float* state = nullptr;   // state_floats
  };

  // What a push did to the rows of this table.
  struct PushCounts {
    uint64_t applied = 0, refused_stale = 0, refused_restored = 0,
             staleness_sum = 0, max_staleness = 0, scaled = 0, created = 0,
             refused_admission = 0;
  };

  struct Counters {
    uint64_t rows = 0, rows_created = 0, rows_evicted_idle = 0,
             rows_evicted_cap = 0, rows_admitted = 0, admission_refused = 0,
             pulls = 0, pushes = 0, rows_pulled = 0, rows_pushed = 0;
  };

  // Checks a spec: name, dim in [1, kMaxTableDim], initializer, optimizer,
  // admission and eviction.
  // INVALID_ARGUMENT naming the table and the field.
  static absl::Status ValidateSpec(const TableSpec& spec);

  // REQUIRES: ValidateSpec(spec).ok(), 0 <= shard_index < num_shards,
  // `map` not null: the map the shard serves now (shared with the owner,
  // which may change it: see AdoptMap). `epoch` (not owned; outlives the
  // table) stamps the rows' changes; null = no stamps. `track_removed`:
  // remember evicted ids (RemovedSince).
  SparseTable(const TableSpec& spec, int shard_index,
              std::shared_ptr<const ServedMap> map,
              const ChangeEpoch* epoch = nullptr, bool track_removed = false);
  ~SparseTable();
  SparseTable(const SparseTable&) = delete;
  SparseTable& operator=(const SparseTable&) = delete;

  // The spec as created (no schedule; see Listed()).
  const TableSpec& spec() const { return spec_; }
  // The spec with its schedule, as listed, checkpointed and journaled.
  TableSpec Listed() const;
  LrSchedule& schedule() { return schedule_; }
  const LrSchedule& schedule() const { return schedule_; }
  int dim() const { return dim_; }
  int state_floats() const { return updater_.state_floats(); }
  // What one row counts against --max_parameter_bytes.
  uint64_t row_bytes() const { return row_bytes_; }
  // What the table itself counts against --max_parameter_bytes: its
  // partitions and admission sketches.
  uint64_t fixed_bytes() const { return fixed_bytes_; }
  bool admits_all() const { return !admission_.enabled(); }
  // Whether rows are evicted under the cap (EVICT_LRU, EVICT_LFU).
  bool evicts_under_cap() const { return eviction_.under_cap(); }

  // OK when `ids` is not empty, has at most `max_ids` entries and every id
  // is homed on this shard (ShardMap::RowHome); else INVALID_ARGUMENT naming
  // the table and the first bad id.
  absl::Status CheckIds(absl::Span<const uint64_t> ids, int64_t max_ids) const;

  // Groups `ids` by partition and looks each up (under shared locks).
  // With `versions` (ids.size() entries), also the version of every row
  // found (0 for missing ones).
  void Find(absl::Span<const uint64_t> ids, Batch* batch,
            uint64_t* versions = nullptr) const;

  // Copies the rows of ids (found by Find into `batch`) into `out`, row i
  // at out + i * dim() * WireBytes(dtype) in the wire encoding, and their
  // versions into versions[i]; creates the rows that are missing (with
  // admission: none; they read their initial values and version 0). Marks
  // every row used at `clock`. Returns the rows created.
  // REQUIRES: the caller reserved batch.missing * row_bytes() bytes.
  uint64_t Read(absl::Span<const uint64_t> ids, Batch* batch, int64_t clock,
                WireDtype dtype, char* out, uint64_t* versions);
  // The same without creating or marking anything: a missing row is
  // answered with its initial values and version 0. Needs no reservation.
  void Peek(absl::Span<const uint64_t> ids, const Batch& batch, WireDtype dtype,
            char* out, uint64_t* versions) const;

  // With admission, the distinct missing ids of `batch` that a push would
  // give a row now, by their counts so far; sets batch->may_create to it.
  // Without, batch->missing.
  uint64_t Admissible(absl::Span<const uint64_t> ids, Batch* batch) const;

  // Applies one push's gradients (grads: ids.size() x dim() floats, all
  // finite; modified in place where duplicates are summed). read_versions
  // is empty (all 0) or one per id. Creates the rows that are missing (a
  // gradient for a row never read applies to its initial values). Per
  // distinct row: a read version newer than the row (it was evicted and
  // created anew since it was read) refuses it as restored; staleness
  // beyond the rule refuses it as stale; else the optimizer updates it with
  // the learning rate scaled as the rule says, and its version goes up by
  // one. Marks every row used at `clock`. With admission, a missing id is
  // counted in the sketch (once per push) and gets a row only when the
  // rule admits it and fewer than batch->may_create rows were created;
  // else its gradient is dropped (refused_admission).
  // REQUIRES: as Read, for batch->may_create rows.
  PushCounts Apply(absl::Span<const uint64_t> ids, Batch* batch,
                   absl::Span<const uint64_t> read_versions, float* grads,
                   const StalenessRule& rule, int64_t clock);

  // Replaces the values of the rows of `ids` (all distinct) by `values`
  // (ids.size() x dim() floats, finite), creating the missing ones; each
  // row's optimizer state is kept (a new row's starts as usual) and its
  // version goes up by one. Marks every row used at `clock`. Returns the
  // counts (applied = rows assigned).
  // REQUIRES: as Read.
  PushCounts Assign(absl::Span<const uint64_t> ids, Batch* batch,
                    const float* values, int64_t clock);

  // Removes the rows last used before `clock` and returns how many.
  // REQUIRES: no request is between Find and Read / Apply on this table.
  // The ids go to *ids (if given) too.
  uint64_t EvictBefore(int64_t clock, std::vector<uint64_t>* ids = nullptr);

  // Under the cap (evicts_under_cap()): the score (store/row_eviction.h) at
  // or below which about `rows` rows lie, from a sample of at most 4096
  // rows per partition, each partition read under its shared lock.
  double EvictionThreshold(uint64_t rows) const;
  // Removes up to `quota` rows of partition `k` whose score is at most
  // `threshold` (under that partition's lock); returns how many.
  // REQUIRES: as EvictBefore.
  // The ids go to *ids (if given) too.
  uint64_t EvictPartition(int k, double threshold, uint64_t quota,
                          std::vector<uint64_t>* ids = nullptr);
  // Evicts the rows of `ids` that exist (another replica's choice), counted
  // as evicted idle or under the cap; returns how many.
  // REQUIRES: as EvictBefore.
  uint64_t EvictIds(absl::Span<const uint64_t> ids, bool idle);

  // Hands every row homed here under the map served now (with `since` > 0:
  // every such row changed at or after that epoch) to `visit`, partition by
  // partition, each under its partition's lock (visit must copy and
  // return); stops at the first error. Rows imported for a slot move not
  // committed yet (Import) are not handed out.
  // REQUIRES: as EvictBefore.
  absl::Status Export(absl::FunctionRef<absl::Status(const RowView&)> visit,
                      uint32_t since = 0) const;

  // Appends to *ids the ids of rows evicted at or after epoch `since` (and
  // not forgotten); empty unless the table tracks removals.
  void RemovedSince(uint32_t since, std::vector<uint64_t>* ids) const;
  // Forgets the evicted ids of epochs before `epoch` (a checkpoint that
  // covers them is durable).
  void ForgetRemovedBefore(uint32_t epoch);

  // Adds a row with the given state (a checkpoint's); INVALID_ARGUMENT if
  // the id is homed elsewhere or (unless `replace`) already present; with
  // `replace` an existing row takes the given state. *created (if given)
  // says whether a row was added. The caller reserved the bytes of a new
  // row. REQUIRES: values has dim() floats, state state_floats().
  absl::Status Restore(uint64_t id, uint64_t version, int64_t touched,
                       const float* values, const float* state,
                       bool replace = false, bool* created = nullptr);
  // ---- Live slot moves (store/sparse_table_moves.cc).

  // Adds a row of a slot this shard does not own yet (a slot move copying
  // it here), or replaces the one imported before, with the given state,
  // stamped changed now. INVALID_ARGUMENT if the id is homed on this shard
  // under the map served now (its row is served: it is not imported). The
  // row is not served until the map gives its slot to this shard (requests
  // are refused by CheckIds as for any row homed elsewhere). *created as
  // Restore. REQUIRES: as Restore.
  absl::Status Import(uint64_t id, uint64_t version, int64_t touched,
                      const float* values, const float* state,
                      bool* created = nullptr);
  // After the map served changed from `prev` to `next`: erases the rows
  // homed here under `prev` and elsewhere under `next` (a slot given away;
  // remembered as removed like evicted rows, so that a delta checkpoint
  // records them) and returns how many; stamps the rows homed
  // elsewhere under `prev` and here under `next` (imported, now owned)
  // changed now, so that the next checkpoint holds them.
  // REQUIRES: as EvictBefore.
  uint64_t AdoptMap(const ShardMap& prev, const ShardMap& next);

  // Whether `id` has a row here.
  bool Contains(uint64_t id) const;
  // Removes the row of `id` (a delta checkpoint's removal) without
  // remembering it as evicted; false when there is none.
  bool Remove(uint64_t id);

  // The rows' values as a caller would pull them, without creating or
  // touching anything; false when the row does not exist (tests, tools).
  bool Peek(uint64_t id, float* values, uint64_t* version) const;

  // Counts a pull or push request over `rows` positions.
  void CountPull(uint64_t rows) {
    pulls_.fetch_add(1, std::memory_order_relaxed);
    rows_pulled_.fetch_add(rows, std::memory_order_relaxed);
  }

  Counters counters() const;
  uint64_t rows() const { return rows_.load(std::memory_order_relaxed); }

 private:
  struct Chunk;  // kChunkRows rows; see sparse_table.cc
  struct Slot {
    uint64_t id;
    uint32_t row1;  // row + 1; 0 = empty slot
  };
  // One lock's share of the rows.
  struct Partition {
    mutable absl::Mutex mu;
    // Open addressing with linear probing; size a power of two, at most 70%
    // full.
    std::vector<Slot> slots ABSL_GUARDED_BY(mu);
    uint32_t used ABSL_GUARDED_BY(mu) = 0;
    std::vector<std::unique_ptr<Chunk>> chunks ABSL_GUARDED_BY(mu);
    uint32_t next_row ABSL_GUARDED_BY(mu) = 0;            // rows ever allocated
    std::vector<uint32_t> free_rows ABSL_GUARDED_BY(mu);  // evicted, reusable
    uint32_t serial ABSL_GUARDED_BY(mu) = 0;              // pushes applied here
    // With admission: counts pushes of ids without a row.
    std::unique_ptr<CountMinSketch> sketch ABSL_GUARDED_BY(mu);
    // With track_removed_: (id, epoch) of evicted rows, oldest first.
    std::vector<std::pair<uint64_t, uint32_t>> removed ABSL_GUARDED_BY(mu);
  };

  static int PartitionOf(uint64_t id);
  // The row of `id` in `p`, or Batch::kNoRow.
  static uint32_t Lookup(const Partition& p, uint64_t id)
      ABSL_SHARED_LOCKS_REQUIRED(p.mu);
  // The row of `id`, created (initialized, unless `initialize` is false)
  // when missing; *created tells which.
  uint32_t FindOrCreate(Partition& p, uint64_t id, int64_t clock,
                        bool initialize, bool* created)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu);
  void InsertSlot(Partition& p, uint64_t id, uint32_t row)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu);
  void EraseSlot(Partition& p, uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu);
  float* RowData(const Partition& p, uint32_t row) const
      ABSL_SHARED_LOCKS_REQUIRED(p.mu);
  // Marks `row` used at `clock` and stamps it changed in epoch `now`
  // (Now(), read once per request).
  void Touch(const Partition& p, uint32_t row, int64_t clock,
             uint32_t now) const ABSL_SHARED_LOCKS_REQUIRED(p.mu);
  // The change epoch to stamp rows with now; 0 = no stamps.
  uint32_t Now() const;
  // Stamps `row` changed in epoch `now` (nothing when 0). `now` is read
  // under p's lock, after which the change is made: a capture that
  // advanced the epoch and then read the partition either saw the change
  // or finds it stamped with its epoch or a later one (slot moves copy in
  // rounds while pushes apply).
  void Stamp(const Partition& p, uint32_t row, uint32_t now) const
      ABSL_SHARED_LOCKS_REQUIRED(p.mu);
  // Copies the rows of partition `k` of a batch out (see Read), marking
  // them used at `clock` when `touch`; missing rows get initial values.
  void CopyOut(const Partition& p, int k, absl::Span<const uint64_t> ids,
               const Batch& batch, int64_t clock, bool touch, WireDtype dtype,
               char* out, uint64_t* versions) const
      ABSL_SHARED_LOCKS_REQUIRED(p.mu);
  // Resolves the missing rows of partition `k` of a batch, creating them
  // (with `admit`, only those the admission rule lets in, while
  // *budget lasts: the others stay kNoRow, counted in *refused).
  uint64_t CreateMissing(Partition& p, int k, absl::Span<const uint64_t> ids,
                         Batch* batch, int64_t clock, bool admit,
                         uint64_t* budget, uint64_t* refused)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu);
  // Removes the row of `id` (present) from `p`.
  void EraseRow(Partition& p, uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu);
  // Restore and Import after their home check: sets the row of `id`.
  absl::Status Put(uint64_t id, uint64_t version, int64_t touched,
                   const float* values, const float* state, bool replace,
                   bool* created);
  // Marks `row` unused and puts it on the free list (its slot is the
  // caller's business).
  void FreeRow(Partition& p, uint32_t row) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu);
  // The eviction score of `row` at clock `now`.
  double ScoreOf(const Partition& p, uint32_t row, int64_t now) const
      ABSL_SHARED_LOCKS_REQUIRED(p.mu);
  // Calls visit(p, begin, end) for every partition p that rows of `batch`
  // fall in (its positions are batch->order[begin, end)), under p's
  // exclusive lock, once its missing rows were created (counted in
  // counts->created; with `admit`, see CreateMissing). Apply and Assign.
  template <typename Visit>
  void ForEachPartitionCreating(absl::Span<const uint64_t> ids, Batch* batch,
                                int64_t clock, bool admit, PushCounts* counts,
                                Visit visit);

  // Const after construction.
  const TableSpec spec_;
  const int dim_;
  const int shard_index_;
  const std::shared_ptr<const ServedMap> map_;
  const ShardMap::TableKey table_key_;  // ShardMap::KeyOf(name)
  const RowInitializer init_;
  const RowUpdater updater_;
  LrSchedule schedule_;
  const size_t stride_;  // floats per row: values, then state
  const uint64_t row_bytes_;
  const AdmissionRule admission_;
  const EvictionRule eviction_;
  const uint64_t fixed_bytes_;
  const ChangeEpoch* const epoch_;  // not owned; may be null
  const bool track_removed_;

  std::unique_ptr<Partition[]> partitions_;

  std::atomic<uint64_t> rows_{0}, created_{0}, evicted_idle_{0},
      evicted_cap_{0}, admitted_{0}, admission_refused_{0}, pushes_{0},
      rows_pushed_{0};
  // Counted by (const) peeks too.
  mutable std::atomic<uint64_t> pulls_{0}, rows_pulled_{0};
  // The latest clock a row was used at (the "now" of LFU scores).
  mutable std::atomic<int64_t> latest_clock_{0};
};

}  // namespace asyncps

#endif  // ASYNCPS_STORE_SPARSE_TABLE_H_
