#ifndef ASYNCPS_STORE_SHARD_STORE_H_
#define ASYNCPS_STORE_SHARD_STORE_H_

// A shard's parameters, without RPC code: its slices of the dense tensors
// and its sparse tables (tables()), serving the CreateTensor, Pull and Push
// messages of proto/asyncps.proto. PreparePush checks a push whole and
// changes nothing; CommitPush applies it and cannot fail.
//
// Example:
//
//   absl::StatusOr<std::unique_ptr<ShardStore>> store =
//       ShardStore::Create(ShardStoreOptions());  // shard 0 of 1
//   if (!store.ok()) return store.status();
//   CreateTensorRequest create;
//   TensorSpec* w = create.add_tensors();  // 4 zeros, SGD with lr 0.1
//   w->set_name("w");
//   w->add_shape(4);
//   w->mutable_optimizer()->set_learning_rate(0.1f);
//   absl::Status s = (*store)->CreateTensors(create).status();
//   if (!s.ok()) return s;
//   PushRequest push;  // a gradient of slice 0, computed from version 0
//   SliceGradient* g = push.add_grads();
//   g->set_tensor("w");
//   EncodeFloats(grad, 4, g->mutable_grad());  // common/payload.h
//   const std::vector<Payload> grads = ShardStore::PayloadsOf(push);
//   absl::StatusOr<ShardStore::PreparedPush> prepared =
//       (*store)->PreparePush(push, grads, /*rows=*/{}, PushMode::kApply);
//   if (!prepared.ok()) return prepared.status();  // nothing was applied
//   PushResponse response;  // one SliceResult per gradient
//   (*store)->CommitPush(&*prepared, StalenessRule(), &response);

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/payload.h"
#include "common/shard_map.h"
#include "common/tensor_layout.h"
#include "proto/asyncps.pb.h"
#include "store/change_epoch.h"
#include "store/dense_slice.h"
#include "store/lr_schedule.h"
#include "store/served_map.h"
#include "store/staleness_rule.h"
#include "store/table_store.h"

namespace asyncps {

struct ShardStoreOptions {
  int shard_index = 0;
  int num_shards = 1;
  // Where every key lives; unset = the static map of num_shards. A map of
  // another shard count is INVALID_ARGUMENT.
  std::optional<ShardMap> map;
  // Slice size used when a TensorSpec leaves slice_elems at 0.
  int64_t default_slice_elems = 4096;
  // Largest slice a spec may ask for (bounds one message's slice payload).
  int64_t max_slice_elems = 16 << 20;
  // Most bytes the tensors may take on this shard: values and optimizer
  // state of the local slices plus the per-slice bookkeeping. Checked
  // before anything is allocated; 0 = no limit. Sparse tables count
  // against it too (their rows as they are created).
  uint64_t max_parameter_bytes = 0;
  // Sparse table rows unused for more than this many steps are evicted
  // (TableStore::EvictIdle); 0 = never.
  int64_t row_ttl_steps = 0;
  // Remember the ids of evicted sparse table rows, with the ChangeEpoch of
  // their eviction, until a checkpoint covering them is durable
  // (TableStore::ForgetRemovedBefore): incremental checkpoints record them
  // as removals. Off: nothing is kept (16 bytes per eviction otherwise).
  bool track_removed_rows = false;
};

// Totals describing what a store holds.
struct StoreSize {
  int32_t tensors = 0;
  int32_t slices = 0;
  uint64_t parameter_bytes = 0;
  uint64_t optimizer_bytes = 0;
  uint64_t reserved_bytes = 0;  // what counts against max_parameter_bytes
  // Sparse tables (included in reserved_bytes, not in parameter_bytes).
  int32_t tables = 0;
  uint64_t table_rows = 0;
  uint64_t table_bytes = 0;
  // Slices AdoptMapRemakingLost made anew since the store was created.
  uint64_t slices_remade = 0;
};

// The parameters one shard owns: dense float32 tensors, of which this shard
// holds the slices whose home (common/shard_map.h) is its index. Every slice
// has its own lock, version and optimizer state; the tensor table's lock is
// taken in shared mode on the pull/push path and exclusively only to add
// tensors. Used by ps_server shards and by ps_worker --local (one shard of
// one), with no RPC code: requests are the protobuf messages of
// proto/asyncps.proto, payloads views of wherever the bytes are. The
// shard's sparse embedding tables live in tables() (store/table_store.h),
// created together with tensors and counted in the same memory budget.
//
// Thread-safe.
class ShardStore {
 public:
  class PreparedPush;

  static absl::StatusOr<std::unique_ptr<ShardStore>> Create(
      const ShardStoreOptions& options);
  ~ShardStore();

  // Creates the requested tensors and tables that do not exist yet, those
  // with INIT_VALUES from the request's values (checked: one entry per such
  // tensor, its length, finite; ignored for a tensor that exists).
  // All-or-nothing: every spec is validated (and compared with an existing
  // tensor or table of the same name: identical = no-op, different =
  // ALREADY_EXISTS naming the field; tensors and tables share one
  // namespace) and the memory they need is checked against
  // max_parameter_bytes (RESOURCE_EXHAUSTED with the numbers) before
  // anything is allocated.
  absl::StatusOr<CreateTensorResponse> CreateTensors(
      const CreateTensorRequest& request);

  // Every tensor's spec with its schedule (store/lr_schedule.h), in no
  // particular order.
  std::vector<TensorSpec> ListTensors() const;

  // Changes learning rates of tensors and tables by the rules of
  // SetLearningRateRequest (all-or-nothing); the answer holds the rate in
  // effect for each name, in request order. *changed says whether any
  // schedule step was applied (the journal must then be written).
  absl::StatusOr<SetLearningRateResponse> SetLearningRates(
      const SetLearningRateRequest& request, bool* changed);

  // The tensors and tables whose rate a schedule changed, by name.
  std::vector<LearningRate> LearningRates() const;

  // OK when every named tensor exists and none repeats (the checks Pull
  // makes), so a pull can be refused before it waits for other workers.
  absl::Status ValidatePull(const PullRequest& request) const;

  // Receives one slice of a pull: tensor name, slice index, version and
  // values. Called under the slice's lock (the values are only valid during
  // the call), so it must copy and return without blocking.
  using SliceSink = DenseSlice::Sink;

  // Hands every local slice of the requested tensors to `sink`, tensor by
  // tensor in request order, slices in index order. NOT_FOUND (and nothing
  // handed out) if any tensor is unknown; INVALID_ARGUMENT if a name repeats.
  absl::Status Pull(const PullRequest& request, SliceSink sink) const;
  // The same, copying each slice into `response` (SliceData.values).
  absl::Status Pull(const PullRequest& request, PullResponse* response) const;

  // A push in two phases, slices and rows together: PreparePush checks
  // all of it and takes what applying needs (the slices, the rows, the new
  // rows' memory); CommitPush then applies it and cannot fail. A prepared
  // push that is dropped uncommitted changed nothing. The caller holds the
  // checkpoint gate across both (server/push_transaction.h does).

  // Checks a push without changing anything: known tensors, slice indices
  // that exist and live on this shard, no slice twice, payload lengths equal
  // to the slice sizes in the payload's wire type, read versions not in the
  // future (unless kRefuseRestored: parameters read from a shard process
  // whose state was since replaced, or an assign, whose read versions mean
  // nothing), all values finite; then the rows as
  // TableStore::PreparePush (which also reserves the new rows' memory:
  // RESOURCE_EXHAUSTED). grads[i] is the payload of request.grads(i), rows[k]
  // of request.rows(k) (the fast path carries them outside the message).
  // The result refers to `request` and the payloads, which must outlive it.
  // REQUIRES: grads.size() == request.grads_size(), rows.size() ==
  // request.rows_size().
  absl::StatusOr<PreparedPush> PreparePush(const PushRequest& request,
                                           absl::Span<const Payload> grads,
                                           absl::Span<const Payload> rows,
                                           PushMode mode);

  // kApply: applies the rows, then the slices one by one under each
  // slice's lock: a slice whose staleness exceeds the rule is refused, the
  // others are applied (with the learning rate scaled if the rule says so)
  // and their versions bumped; an assign (PushRequest.assign) replaces each
  // slice's values instead and bumps its version. kRefuseRestored: applies
  // nothing and answers every slice and row REFUSED_RESTORED. Appends one
  // SliceResult per gradient, in order, and one RowsResult per table. A
  // prepared push is committed at most once.
  void CommitPush(PreparedPush* push, const StalenessRule& rule,
                  PushResponse* response);

  // The payloads of a protobuf push: float32 views of each SliceGradient.grad.
  static std::vector<Payload> PayloadsOf(const PushRequest& request);

  StoreSize Size() const;

  // options().map is the map the store started with; map() is the one
  // served now.
  const ShardStoreOptions& options() const { return options_; }
  // Where every key lives now: the options' map (or the static map of their
  // num_shards) until AdoptMap changes it. A copy (cheap: the slot table is
  // shared), consistent in itself; a caller that checks several keys
  // against one map reads it once.
  ShardMap map() const { return map_->get(); }
  // map().epoch(), without a lock.
  uint64_t map_epoch() const { return map_->epoch(); }

  // The sparse tables, sharing this store's memory budget.
  TableStore& tables() { return *tables_; }
  const TableStore& tables() const { return *tables_; }

  // Changes for incremental checkpoints (store/change_epoch.h): every slice
  // is stamped with the epoch of its creation and of each push applied to
  // it, every row with that of its creation and last use.
  uint32_t change_epoch() const { return epoch_.current(); }
  // Starts a new epoch and returns it (a checkpoint capture, with pushes
  // held back).
  uint32_t AdvanceChangeEpoch() { return epoch_.Advance(); }

  // ---- Export and import of the whole state, for checkpoints.

  // One local slice as Export hands it out (DenseSlice::View). The spans
  // point into the slice and are valid only during the call.
  using SliceView = DenseSlice::View;

  // Calls tensor(spec) (with its schedule) and then slice(view) for each of
  // its local slices (those of the map served now) in index order, for
  // every tensor in name order; stops at the first error either returns.
  // Each slice is read under its own lock and the tensor table's shared
  // lock (slice() must copy and return without blocking or calling the
  // store), so every slice is internally consistent;
  // the whole export is a consistent cut only if no push applies meanwhile
  // (the caller's business). A tensor created during the walk may be missed.
  absl::Status Export(
      absl::FunctionRef<absl::Status(const TensorSpec&)> tensor,
      absl::FunctionRef<absl::Status(const SliceView&)> slice) const;

  // Adds a tensor whose local slices are then filled by RestoreSlice: the
  // spec is validated (and counted against max_parameter_bytes) like
  // CreateTensors does, but slices start at zero with version 0 instead of
  // being initialized; the schedule it carries (as Export gives it) is
  // restored. FAILED_PRECONDITION if a tensor of that name exists.
  absl::Status RestoreTensor(const TensorSpec& spec);

  // Sets a local slice's version, values and optimizer state from
  // little-endian float32 bytes. INVALID_ARGUMENT (naming the slice) unless
  // the tensor exists, the slice lives here, and the values and the state
  // buffers (as many as the tensor's optimizer keeps) have the slice's size.
  absl::Status RestoreSlice(
      absl::string_view tensor, uint32_t index, uint64_t version,
      absl::string_view values,
      absl::Span<const absl::string_view> optimizer_state);

  // ---- Live slot moves (proto/slot_moves.proto): a slot's state leaves
  // one shard for another while workers train. The destination imports
  // the slots' slices (ImportSlice) and rows (TableStore::ImportRows) in
  // rounds while the source serves them, then both adopt the next map
  // (AdoptMap): the destination serves what it imported, the source drops
  // what it gave away.

  // OK when AdoptMap(next) would be: `next` is slotted, of the slot count
  // and shard count of the map served now (INVALID_ARGUMENT otherwise),
  // and either that very map or of a higher epoch (FAILED_PRECONDITION
  // naming both epochs). Changes nothing. Whether `next` leaves this
  // shard's own slots as they are is OwnsSameSlots (common/shard_map.h).
  absl::Status CheckAdoptable(const ShardMap& next) const;

  // Serves `next` from now on (checked as CheckAdoptable; the map served
  // now again is a no-op). The slices and rows of slots this shard owned
  // and `next` gives away are dropped: slices freed, rows erased (as
  // evictions are), their bytes given back to max_parameter_bytes. The
  // slices imported for slots `next` gives to this shard are served from
  // now on (a slot gained with nothing imported has no slice here: pulls
  // skip it, pushes to it are refused); imported rows of such slots are
  // served too. What was gained is stamped changed now, so that the next
  // checkpoint holds it.
  // REQUIRES: no push is between PreparePush and CommitPush (the caller
  // holds the pushes back). Pulls may run meanwhile: one sees the slices
  // of the map before or of the map after, never a mix (the tensor table's
  // lock is held exclusively while the map changes and slices go).
  absl::Status AdoptMap(const ShardMap& next);
  // The same, once `check` (called under the lock that creations of
  // tensors and tables take too) returned OK; its error otherwise, and
  // nothing changed.
  absl::Status AdoptMap(const ShardMap& next,
                        absl::FunctionRef<absl::Status()> check);
  // AdoptMap for a map that gives this shard slots whose state is gone:
  // the run's map moved them here, and every process that held them was
  // lost before this one's files (or snapshot) caught up with that move.
  // After adopting `next`, every slice of such a slot (gained with nothing
  // imported) is made anew of its tensor's spec, initialized as
  // CreateTensor does (the same values on every replica; a tensor created
  // with INIT_VALUES gets zeros, its values being only in checkpoints), its
  // bytes counted against max_parameter_bytes without a cap. Rows need
  // nothing: a missing row is made when first pulled. Returns how many
  // slices were made.
  absl::StatusOr<uint64_t> AdoptMapRemakingLost(const ShardMap& next);

  // Sets slice `index` of `tensor`, of a slot another shard owns under the
  // map served now, from a slot move: version, values and optimizer state
  // as RestoreSlice takes them. Creates the slice (its bytes reserved:
  // RESOURCE_EXHAUSTED) or overwrites the one imported before; stamps it
  // changed now. It is not served until AdoptMap gives its slot to this
  // shard. NOT_FOUND for an unknown tensor (every shard holds every
  // tensor's spec); INVALID_ARGUMENT (naming the slice) for an index out
  // of range, a slice homed here, or buffers of the wrong size.
  absl::Status ImportSlice(absl::string_view tensor, uint32_t index,
                           uint64_t version, absl::string_view values,
                           absl::Span<const absl::string_view> optimizer_state);

  // Drops everything imported (ImportSlice, TableStore::ImportRows) and not
  // served yet, giving its bytes back: a move that was aborted. Returns the
  // slices and rows dropped.
  std::pair<uint64_t, uint64_t> DropImports();

 private:
  struct Tensor;

  // The values given for INIT_VALUES tensors, by tensor name.
  using GivenValues = absl::flat_hash_map<std::string, std::vector<float>>;

  ShardStore(const ShardStoreOptions& options, const ShardMap& map);
  absl::StatusOr<TensorSpec> Resolve(const TensorSpec& spec) const;

  // The steps of CreateTensors, in order. The request's tensor specs,
  // each resolved (Resolve); INVALID_ARGUMENT for a name twice.
  absl::StatusOr<std::vector<TensorSpec>> ResolveSpecs(
      const CreateTensorRequest& request) const;
  // The request's values: one entry per INIT_VALUES tensor of `specs`, of
  // its length, finite; none for other tensors (INVALID_ARGUMENT).
  static absl::StatusOr<GivenValues> DecodeGivenValues(
      const CreateTensorRequest& request, const std::vector<TensorSpec>& specs);
  // The specs of `specs` no tensor has yet (pointers into `specs`);
  // ALREADY_EXISTS naming the field for one that exists with another spec.
  absl::StatusOr<std::vector<const TensorSpec*>> MissingTensors(
      const std::vector<TensorSpec>& specs) const;
  // Reserves the bytes of every `missing` tensor at once
  // (RESOURCE_EXHAUSTED, nothing reserved, when they do not fit) and builds
  // them, initialized (from `given` for INIT_VALUES).
  absl::StatusOr<std::vector<std::unique_ptr<Tensor>>> BuildMissing(
      const std::vector<const TensorSpec*>& missing, const GivenValues& given);
  // ALREADY_EXISTS when a creation since MissingTensors took a name of the
  // request with another spec, or a tensor's name for a table or the
  // reverse.
  absl::Status CheckStillNew(const std::vector<TensorSpec>& specs,
                             const std::vector<std::unique_ptr<Tensor>>& fresh,
                             const TableStore::Staged& tables) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds the `fresh` tensors and the staged tables under the exclusive
  // lock once CheckStillNew passes (else the fresh tensors' bytes go back);
  // answers for every spec of the request.
  absl::StatusOr<CreateTensorResponse> Publish(
      const std::vector<TensorSpec>& specs,
      std::vector<std::unique_ptr<Tensor>> fresh, TableStore::Staged* tables);

  // The bytes a tensor takes on this shard (values, optimizer state,
  // bookkeeping); ~0 when that overflows.
  uint64_t BytesOf(const TensorSpec& spec) const;
  // Builds a tensor with its local slices (initialized unless restoring:
  // from `given`, the whole tensor's values, when not null) whose `bytes`
  // the caller reserved.
  std::unique_ptr<Tensor> BuildTensor(const TensorSpec& spec, bool initialize,
                                      uint64_t bytes, const float* given) const;
  void Unreserve(uint64_t bytes);
  // Reserves bytes against max_parameter_bytes; RESOURCE_EXHAUSTED
  // "<what_needs> <bytes> bytes on shard ..." when they do not fit.
  absl::Status ReserveBytes(uint64_t bytes, const std::string& what_needs);
  // Validates the pull; hands slices out only when sink is not null.
  absl::Status PullInto(const PullRequest& request,
                        const SliceSink* sink) const;
  const Tensor* FindTensor(absl::string_view name) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  Tensor* FindMutableTensor(absl::string_view name) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // INVALID_ARGUMENT (naming the slice) unless `index` is a slice of `t`
  // and the values and state buffers are of its size: RestoreSlice's and
  // ImportSlice's checks of what they are given.
  static absl::Status CheckSliceState(
      const Tensor& t, uint32_t index, absl::string_view values,
      absl::Span<const absl::string_view> optimizer_state);
  // The part of AdoptMap under the tensor table's lock: serves `next`,
  // drops the slices it gives away (into *dropped, freed by the caller
  // after the lock) and installs the imported slices it gives here.
  void AdoptSlices(const ShardMap& next,
                   std::vector<std::unique_ptr<DenseSlice>>* dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // AdoptMap's work, and with `remake_lost` AdoptMapRemakingLost's: how
  // many slices it made.
  absl::StatusOr<uint64_t> AdoptMapMaking(
      const ShardMap& next, absl::FunctionRef<absl::Status()> check,
      bool remake_lost);
  // AdoptMapRemakingLost's part under the same lock, after AdoptSlices:
  // makes the slices this shard owns and lacks; returns how many.
  uint64_t RemakeMissingSlices() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t slices_remade_ ABSL_GUARDED_BY(mu_) = 0;
  // The slice of a push gradient, or why it is not one of this shard's.
  absl::StatusOr<DenseSlice*> FindSlice(const Tensor* t,
                                        const SliceGradient& g) const;
  // The slices part of PreparePush (its rows_ left empty).
  absl::StatusOr<PreparedPush> PrepareSlices(const PushRequest& request,
                                             absl::Span<const Payload> grads,
                                             PushMode mode) const;

  const ShardStoreOptions options_;
  // The map served now, shared with tables_ and its tables.
  const std::shared_ptr<ServedMap> map_;
  // Outlives the tensors and tables, which point to it.
  ChangeEpoch epoch_;

  // Held exclusively by AdoptMap and shared by what places slices by the
  // map (CreateTensors, RestoreTensor, ImportSlice), so that the map does
  // not change under them. Locked before schedule_mu_ and mu_.
  mutable absl::Mutex change_mu_;
  // Serializes SetLearningRates. Locked before mu_.
  absl::Mutex schedule_mu_;
  mutable absl::Mutex mu_ ABSL_ACQUIRED_AFTER(change_mu_);
  // Tensors are never removed, so Tensor pointers stay valid for the life of
  // the store. A DenseSlice pointer stays valid while mu_ is held, or while
  // change_mu_ is (only AdoptMap drops slices), or from a push's
  // PreparePush to its CommitPush (AdoptMap requires none meanwhile).
  absl::flat_hash_map<std::string, std::unique_ptr<Tensor>> tensors_
      ABSL_GUARDED_BY(mu_);
  // Bytes held or being allocated by tensors and tables (see
  // max_parameter_bytes).
  uint64_t reserved_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Locked after mu_ when both are (table creation).
  std::unique_ptr<TableStore> tables_;
};

// A push checked by PreparePush: the slices it touches, in request order,
// and its prepared rows. Opaque outside the store. Move-only.
class ShardStore::PreparedPush {
 public:
  size_t size() const { return slices_.size(); }

 private:
  friend class ShardStore;
  const PushRequest* request_ = nullptr;  // null once committed
  absl::Span<const Payload> grads_;
  PushMode mode_ = PushMode::kApply;
  std::vector<DenseSlice*> slices_;
  std::vector<const LrSchedule*> schedules_;  // of each slice's tensor
  TableStore::PreparedRows rows_;
};

}  // namespace asyncps

#endif  // ASYNCPS_STORE_SHARD_STORE_H_
