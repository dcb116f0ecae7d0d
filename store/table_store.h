#ifndef ASYNCPS_STORE_TABLE_STORE_H_
#define ASYNCPS_STORE_TABLE_STORE_H_

// The sparse embedding tables of one shard, reached as ShardStore::tables()
// (store/shard_store.h): tables are created and row gradients pushed
// through ShardStore together with the dense tensors; row pulls, listing,
// eviction of idle rows and checkpoints call the TableStore directly. Rows
// are created on first touch, on the shard the run's ShardMap
// (common/shard_map.h) names.
//
// Example:
//
//   // Rows 3 and 70001 of table "emb", as float32 into `values`.
//   PullRequest pull;
//   TableIds* ids = pull.add_rows();
//   ids->set_table("emb");
//   ids->add_ids(3);
//   ids->add_ids(70001);
//   PullResponse response;  // rows(0).versions(): updates of each row
//   std::string values;     // 2 x dim floats
//   absl::Status s = store->tables().Pull(
//       pull, /*clock=*/worker_clock, WIRE_F32, &response,
//       [&values](int /*k*/, size_t bytes) {
//         values.resize(bytes);
//         return values.data();
//       });
//
//   // Rows unused for row_ttl_steps steps of the fastest worker go away.
//   const uint64_t evicted = store->tables().EvictIdle(fastest_clock);
//
// Under a memory cap, tables with an eviction policy (TableSpec.eviction)
// give up their coldest rows whenever new rows of any table do not fit:
// the request that needs room evicts (MakeRoom), and the shard's
// background thread keeps some room free (EvictToWatermark).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/payload.h"
#include "common/shard_map.h"
#include "proto/asyncps.pb.h"
#include "store/served_map.h"
#include "store/sparse_table.h"
#include "store/staleness_rule.h"

namespace asyncps {

struct TableStoreOptions {
  int shard_index = 0;
  // Where every row lives: the map the shard serves now, shared with the
  // owner (a ShardStore), which may change it (AdoptMap). Null = the map of
  // a one-shard run.
  std::shared_ptr<const ServedMap> map;
  // Rows not pulled or pushed for more than this many steps (worker clock
  // ticks) are evicted by EvictIdle; 0 = never.
  int64_t row_ttl_steps = 0;
  // Most ids of one table in one request.
  int64_t max_ids_per_table = int64_t{1} << 20;
  // The shard's memory budget (ShardStoreOptions::max_parameter_bytes),
  // shared with the dense tensors: reserve() fails with RESOURCE_EXHAUSTED
  // (naming `what` and the numbers) and reserves nothing when `bytes` do
  // not fit. Both must be set.
  std::function<absl::Status(uint64_t bytes, const std::string& what)> reserve;
  std::function<void(uint64_t bytes)> release;
  // The budget (0 = no limit) and what is reserved of it now; both set
  // when max_bytes is.
  uint64_t max_bytes = 0;
  std::function<uint64_t()> reserved;
  // Stamps the rows' changes (store/change_epoch.h); not owned, outlives
  // the store; null = no stamps.
  const ChangeEpoch* epoch = nullptr;
  // Remember the ids of evicted rows for incremental checkpoints (see
  // ShardStoreOptions::track_removed_rows).
  bool track_removed_rows = false;
};

// How a push's slices and rows are applied.
enum class PushMode {
  kApply,
  // Validated (read versions may be from the future), then every slice and
  // row refused as REFUSED_RESTORED: the push was read before the shard
  // restarted.
  kRefuseRestored,
};

// The sparse embedding tables of one shard (store/sparse_table.h) and the
// rows parts of pull and push requests (proto/asyncps.proto, "rows"): the
// same all-or-nothing validation as dense slices, rows created on first
// touch, memory reserved before anything is created. Owned by a
// ShardStore, which shares its memory budget and creates tables together
// with tensors.
//
// Eviction (row_ttl_steps, or under the cap) is kept apart from requests:
// every pull and push holds a shared lock for its whole duration, EvictIdle
// and Export hold it exclusively and shared; eviction under the cap holds
// it exclusively for one table partition at a time. A request whose new
// rows do not fit lets go of it, has rows evicted, and starts again (a few
// times, then RESOURCE_EXHAUSTED). Thread-safe.
class TableStore {
 public:
  // New tables, validated and with their bytes reserved, not yet visible.
  // Gives the bytes back unless committed. Move-only.
  class Staged;

  // A validated rows push, ready to commit (see PreparePush).
  class PreparedRows;

  explicit TableStore(TableStoreOptions options);
  ~TableStore();
  TableStore(const TableStore&) = delete;
  TableStore& operator=(const TableStore&) = delete;

  const TableStoreOptions& options() const { return options_; }

  // ---- Tables.

  // Validates `specs` and compares them with existing tables (identical:
  // nothing to do; different: ALREADY_EXISTS naming the field); reserves
  // the new tables' bytes. INVALID_ARGUMENT for a bad spec or a name twice.
  absl::StatusOr<Staged> Stage(
      const google::protobuf::RepeatedPtrField<TableSpec>& specs);
  // ALREADY_EXISTS if a staged table's name was taken meanwhile by a table
  // with another spec, or is taken by a tensor (is_tensor(name)).
  absl::Status CheckStaged(
      const Staged& staged,
      absl::FunctionRef<bool(const std::string&)> is_tensor) const;
  // Adds the staged tables nobody added meanwhile; returns how many. The
  // bytes of the others go back when `staged` is destroyed (not here: the
  // caller may hold the lock the budget takes).
  int Commit(Staged* staged);

  bool Contains(absl::string_view name) const;
  // Name order, each spec with its schedule (SparseTable::Listed).
  std::vector<TableSpec> List() const;
  // The table, or nullptr. Tables are never removed.
  const SparseTable* Find(absl::string_view name) const;
  // The table's learning-rate schedule, or nullptr.
  LrSchedule* FindSchedule(absl::string_view name);

  // ---- Rows.

  // OK when every TableIds names a known table (else NOT_FOUND), no table
  // repeats and its ids pass SparseTable::CheckIds (INVALID_ARGUMENT).
  absl::Status ValidatePull(const PullRequest& request) const;

  // Reads the rows of request.rows, creating missing ones (unless the
  // entry is a peek: see TableIds.peek), into
  // response->rows (table, versions, payload_bytes) in the request's
  // order; table k's values go to buffer(k, payload_bytes) in wire type
  // `dtype`. Rows are marked used at `clock`. RESOURCE_EXHAUSTED (and
  // nothing created) when the new rows do not fit; errors of ValidatePull.
  absl::Status Pull(const PullRequest& request, int64_t clock, WireDtype dtype,
                    PullResponse* response,
                    absl::FunctionRef<char*(int k, size_t bytes)> buffer);

  // ---- Row pushes, in two phases (ShardStore::PreparePush and CommitPush
  // run them together with the push's dense slices).

  // Validates request.rows (grads[k] is the payload of request.rows(k)) as
  // a whole: known tables (NOT_FOUND), no table twice, ids (see CheckIds),
  // read_versions empty or one per id, payload size ids x dim in its wire
  // type, finite values, read versions not newer than the rows (unless
  // kRefuseRestored, or rows may be evicted, or an assign), no id twice in
  // an assign (PushRequest.assign), and, unless kRefuseRestored,
  // reserves the memory of the rows the push will create
  // (RESOURCE_EXHAUSTED when they do not fit). Changes nothing else. The
  // result holds the shared eviction lock, so the rows it found stay
  // where they are until it is committed or destroyed; it refers to
  // `request`, which must outlive it. REQUIRES: grads.size() ==
  // request.rows_size().
  absl::StatusOr<PreparedRows> PreparePush(const PushRequest& request,
                                           absl::Span<const Payload> grads,
                                           PushMode mode);

  // Applies the prepared rows (kApply: rows created, stale ones refused by
  // `rule`; an assign replaces their values, SparseTable::Assign) or
  // refuses every one (kRefuseRestored), appends one RowsResult
  // per table, and lets go of the eviction lock and of the memory not
  // used. Cannot fail. A PreparedRows is committed at most once.
  void CommitPush(PreparedRows* rows, const StalenessRule& rule,
                  PushResponse* response);

  // The payloads of a protobuf push: float32 views of RowsGradient.grad.
  static std::vector<Payload> PayloadsOf(const PushRequest& request);

  // With row_ttl_steps > 0, evicts the rows last used more than
  // row_ttl_steps before `clock` (the fastest live worker's), at most once
  // per row_ttl_steps / 8 steps of `clock`; returns the rows evicted.
  uint64_t EvictIdle(int64_t clock);

  // Under a cap, with evicting tables holding rows: evicts rows until at
  // least `bytes` plus 1/64 of the cap are free (or nothing is left to
  // evict); every evicting table gives up its coldest rows (its policy's
  // ranking), a share of the bytes in proportion to the row bytes it holds,
  // in steps of one partition. Returns the rows evicted. REQUIRES: the
  // caller holds no eviction lock (no pending request of its own).
  uint64_t MakeRoom(uint64_t bytes);
  // When less than 1/32 of the cap is free, evicts until 1/16 is (see
  // MakeRoom); the shard's background thread calls it. Returns the rows
  // evicted.
  uint64_t EvictToWatermark();
  // Whether EvictToWatermark or EvictIdle(clock) has anything to do now
  // (cheap: no row is read).
  bool EvictionDue(int64_t clock) const;

  // Called with the ids of every eviction (EvictIdle, MakeRoom,
  // EvictToWatermark) on the thread that evicted, once per table and
  // round, without the eviction lock: a replicated shard's primary logs
  // them for its backups. Set before the store serves requests.
  using EvictionListener = std::function<void(
      absl::string_view table, absl::Span<const uint64_t> ids, bool idle)>;
  void set_eviction_listener(EvictionListener listener) {
    listener_ = std::move(listener);
  }
  // Evicts the rows of `ids` that exist, as another replica chose them
  // (idle: for row_ttl_steps, else under the cap), and gives their bytes
  // back; returns how many. INVALID_ARGUMENT for an unknown table.
  absl::StatusOr<uint64_t> EvictRows(absl::string_view table,
                                     absl::Span<const uint64_t> ids, bool idle);

  // ---- Checkpoints.

  // Calls table(spec) (with its schedule), then row(view) for each of its
  // rows, for every table in name order; stops at the first error. Each row is
  // read under its partition's lock; no row is evicted meanwhile. A consistent
  // cut only if no push applies meanwhile (the caller's business).
  absl::Status Export(
      absl::FunctionRef<absl::Status(const TableSpec&)> table,
      absl::FunctionRef<absl::Status(const SparseTable::RowView&)> row) const;
  // The same for a delta: after each table(spec), removed(ids) with the ids
  // of its rows evicted at or after epoch `since` (possibly none), then
  // row(view) for its rows changed at or after `since`.
  absl::Status ExportSince(
      uint32_t since, absl::FunctionRef<absl::Status(const TableSpec&)> table,
      absl::FunctionRef<absl::Status(absl::Span<const uint64_t>)> removed,
      absl::FunctionRef<absl::Status(const SparseTable::RowView&)> row) const;
  // Forgets the evicted ids of epochs before `epoch` in every table.
  void ForgetRemovedBefore(uint32_t epoch);

  // Adds a table whose rows RestoreRows then fills (validated, counted in
  // the budget), with the schedule `spec` carries; FAILED_PRECONDITION if
  // it or a tensor of that name exists.
  absl::Status RestoreTable(const TableSpec& spec);
  // Adds rows of a restored table: ids, versions and touched of equal
  // length, values ids x dim float32 and state ids x state floats.
  // INVALID_ARGUMENT naming what does not fit.
  // With `replace` (a delta), rows that exist take the given state.
  absl::Status RestoreRows(absl::string_view table,
                           absl::Span<const uint64_t> ids,
                           absl::Span<const uint64_t> versions,
                           absl::Span<const int64_t> touched,
                           absl::string_view values, absl::string_view state,
                           bool replace = false);
  // Removes the rows of `ids` that exist (a delta's evictions) and gives
  // their bytes back; INVALID_ARGUMENT for an unknown table.
  absl::Status RemoveRows(absl::string_view table,
                          absl::Span<const uint64_t> ids);

  // ---- Live slot moves (proto/slot_moves.proto).

  // Adds or replaces rows of slots this shard does not own yet under the
  // map served now, which a slot move copies here before the map gives
  // them to it (SparseTable::Import): arguments and checks as RestoreRows
  // (without `replace`), and INVALID_ARGUMENT for a row homed here. The
  // new rows' bytes are reserved (RESOURCE_EXHAUSTED); rows are stamped
  // changed now. Rows before a bad one stay imported.
  absl::Status ImportRows(absl::string_view table,
                          absl::Span<const uint64_t> ids,
                          absl::Span<const uint64_t> versions,
                          absl::Span<const int64_t> touched,
                          absl::string_view values, absl::string_view state);
  // After the map served changed from `prev` to `next`: erases the rows of
  // slots given away and gives their bytes back, and stamps the imported
  // rows of slots gained changed now (SparseTable::AdoptMap), one table at
  // a time under the exclusive eviction lock. Returns the rows erased.
  uint64_t AdoptMap(const ShardMap& prev, const ShardMap& next);

  // ---- Status.

  // Per table, in name order.
  std::vector<TableStatus> Status() const;
  struct Totals {
    int32_t tables = 0;
    uint64_t rows = 0;
    uint64_t bytes = 0;  // counted against the budget
  };
  Totals totals() const;

 private:
  enum class PutMode { kRestore, kReplace, kImport };
  // RestoreRows (kRestore; kReplace with `replace`) and ImportRows.
  absl::Status PutRows(absl::string_view table, absl::Span<const uint64_t> ids,
                       absl::Span<const uint64_t> versions,
                       absl::Span<const int64_t> touched,
                       absl::string_view values, absl::string_view state,
                       PutMode mode);
  std::vector<SparseTable*> Sorted() const;  // by name
  SparseTable* FindMutable(absl::string_view name) const;
  // The table of each request entry, checked as ValidatePull says.
  template <typename Entry>
  absl::StatusOr<std::vector<SparseTable*>> Resolve(
      const google::protobuf::RepeatedPtrField<Entry>& entries) const;
  uint64_t TableBytes(const SparseTable& t) const;
  // Whether some table evicts under the cap and holds rows.
  bool CanEvict() const;
  // EvictionDue's halves: under the cap with little room left; rows idle
  // long enough may have accrued since the last EvictIdle.
  bool WatermarkDue() const;
  bool IdleDue(int64_t clock) const;
  // Evicts about `bytes` of rows (see MakeRoom).
  uint64_t FreeBytes(uint64_t bytes);
  // Reserves `bytes`, making room by eviction when they do not fit.
  absl::Status ReserveWithRoom(uint64_t bytes, const std::string& what);
  // For a table that evicts under the cap: RESOURCE_EXHAUSTED unless the cap
  // leaves room for its own bytes and EvictionRule::kMinRows rows.
  absl::Status CheckMinimum(const SparseTable& t) const;
  // One try of Pull under the shared eviction lock. When new rows do not
  // fit but eviction could make room, sets *short_bytes (if given) to the
  // bytes needed.
  absl::Status PullOnce(const PullRequest& request,
                        const std::vector<SparseTable*>& tables, int64_t clock,
                        WireDtype dtype, PullResponse* response,
                        absl::FunctionRef<char*(int k, size_t bytes)> buffer,
                        uint64_t* short_bytes);
  // Finds the rows of a push and reserves its new rows, as PullOnce.
  // REQUIRES: out->evict_mu_ held (shared).
  absl::Status FindPushRows(const PushRequest& request, PushMode mode,
                            PreparedRows* out, uint64_t* short_bytes);
  // Resolves the tables of request.rows and decodes their gradients into
  // float32, checking them as CheckPush says.
  absl::Status DecodePush(const PushRequest& request,
                          absl::Span<const Payload> grads,
                          std::vector<SparseTable*>* tables,
                          std::vector<std::vector<float>>* decoded) const;

  const TableStoreOptions options_;

  // Shared by requests, exclusive for eviction: see the class comment.
  mutable absl::Mutex evict_mu_;
  int64_t last_evict_clock_ ABSL_GUARDED_BY(evict_mu_) = 0;
  // One MakeRoom at a time (a second one may find the room made).
  absl::Mutex room_mu_ ABSL_ACQUIRED_BEFORE(evict_mu_);
  EvictionListener listener_;  // may be empty; set before requests

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<SparseTable>> tables_
      ABSL_GUARDED_BY(mu_);
};

class TableStore::Staged {
 public:
  Staged(Staged&& other) noexcept;
  Staged& operator=(Staged&&) = delete;
  ~Staged();

  // The specs of the request, in its order (as they are stored).
  const std::vector<TableSpec>& specs() const { return specs_; }

 private:
  friend class TableStore;
  explicit Staged(TableStore* store) : store_(store) {}

  TableStore* store_;
  std::vector<TableSpec> specs_;
  std::vector<std::unique_ptr<SparseTable>> fresh_;
  uint64_t reserved_ = 0;  // bytes of fresh_, given back unless committed
};

class TableStore::PreparedRows {
 public:
  // A push without rows: nothing to apply, no lock held.
  PreparedRows() = default;
  PreparedRows(PreparedRows&& other) noexcept;
  PreparedRows& operator=(PreparedRows&& other) noexcept;
  // Uncommitted: nothing was changed; the reserved memory goes back.
  ~PreparedRows();

  bool empty() const { return tables_.empty(); }

 private:
  friend class TableStore;
  // Lets go of the eviction lock and of the reserved bytes still unused.
  void Release();

  TableStore* store_ = nullptr;
  const PushRequest* request_ = nullptr;
  PushMode mode_ = PushMode::kApply;
  // Held shared while set: the rows in batches_ stay valid.
  absl::Mutex* evict_mu_ = nullptr;
  std::vector<SparseTable*> tables_;         // of request_->rows(k)
  std::vector<std::vector<float>> decoded_;  // float32 gradients
  std::vector<SparseTable::Batch> batches_;  // the rows found
  uint64_t reserved_ = 0;  // bytes of the rows to create, not yet used
};

}  // namespace asyncps

#endif  // ASYNCPS_STORE_TABLE_STORE_H_
