#ifndef ASYNCPS_SERVER_SHARD_STORE_H_
#define ASYNCPS_SERVER_SHARD_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/float_codec.h"
#include "common/tensor_layout.h"
#include "proto/asyncps.pb.h"
#include "server/optimizer.h"

namespace asyncps {

struct ShardStoreOptions {
  int shard_index = 0;
  int num_shards = 1;
  // Slice size used when a TensorSpec leaves slice_elems at 0.
  int64_t default_slice_elems = 4096;
  // Largest slice a spec may ask for (bounds one message's slice payload).
  int64_t max_slice_elems = 16 << 20;
};

// How stale a pushed gradient may be, and how staleness scales it.
struct StalenessRule {
  int64_t max_staleness = -1;  // -1 = unbounded
  bool inverse_lr = false;     // lr / (1 + staleness)
};

// Totals describing what a store holds.
struct StoreSize {
  int32_t tensors = 0;
  int32_t slices = 0;
  uint64_t parameter_bytes = 0;
  uint64_t optimizer_bytes = 0;
};

// The parameters one shard owns: dense float32 tensors, of which this shard
// holds the slices whose home (common/sharding.h) is its index. Every slice
// has its own lock and version counter; the tensor table's lock is taken in
// shared mode on the pull/push path and exclusively only to add tensors.
//
// Thread-safe.
class ShardStore {
 public:
  class Slice;

  static absl::StatusOr<std::unique_ptr<ShardStore>> Create(
      const ShardStoreOptions& options);
  ~ShardStore();

  // Creates the requested tensors that do not exist yet. All-or-nothing:
  // every spec is validated (and compared with an existing tensor of the
  // same name: identical = no-op, different = ALREADY_EXISTS naming the
  // field) before anything is created.
  absl::StatusOr<CreateTensorResponse> CreateTensors(
      const CreateTensorRequest& request);

  std::vector<TensorSpec> ListTensors() const;

  // OK when every named tensor exists and none repeats (the checks Pull
  // makes), so a pull can be refused before it waits for other workers.
  absl::Status ValidatePull(const PullRequest& request) const;

  // Receives one slice of a pull: tensor name, slice index, version and
  // values. Called under the slice's lock (the values are only valid during
  // the call), so it must copy and return without blocking.
  using SliceSink = absl::FunctionRef<void(const std::string& tensor,
                                           uint32_t slice, uint64_t version,
                                           absl::Span<const float> values)>;

  // Hands every local slice of the requested tensors to `sink`, tensor by
  // tensor in request order, slices in index order. NOT_FOUND (and nothing
  // handed out) if any tensor is unknown; INVALID_ARGUMENT if a name repeats.
  absl::Status Pull(const PullRequest& request, SliceSink sink) const;
  // The same, copying each slice into `response` (SliceData.values).
  absl::Status Pull(const PullRequest& request, PullResponse* response) const;

  // Checks a push without changing anything: known tensors, slice indices
  // that exist and live on this shard, no slice twice, payload lengths equal
  // to the slice sizes, read versions not in the future, all values finite.
  // grads[i] is the payload of request.grads(i) (the fast path carries it
  // outside the message). Returns the slices in request order, for ApplyPush.
  // REQUIRES: grads.size() == request.grads_size().
  absl::StatusOr<std::vector<Slice*>> ValidatePush(
      const PushRequest& request, absl::Span<const FloatPayload> grads) const;
  // The same with the payloads in SliceGradient.grad.
  absl::StatusOr<std::vector<Slice*>> ValidatePush(
      const PushRequest& request) const;

  // Applies a validated push slice by slice under each slice's lock: a slice
  // whose staleness exceeds the rule is refused, the others are applied
  // (with the learning rate scaled if the rule says so) and their versions
  // bumped. One SliceResult per gradient, in order, is appended to response.
  // REQUIRES: slices == ValidatePush(request, grads).value().
  void ApplyPush(const PushRequest& request,
                 absl::Span<const FloatPayload> grads,
                 const std::vector<Slice*>& slices, const StalenessRule& rule,
                 PushResponse* response);
  // The same with the payloads in SliceGradient.grad.
  void ApplyPush(const PushRequest& request, const std::vector<Slice*>& slices,
                 const StalenessRule& rule, PushResponse* response);

  // The payloads of a protobuf push: views of each SliceGradient.grad.
  static std::vector<FloatPayload> PayloadsOf(const PushRequest& request);

  StoreSize Size() const;

  const ShardStoreOptions& options() const { return options_; }

  // ---- Export and import of the whole state, for checkpoints
  // (server/checkpoint.h).

  // One local slice as ReadSlice hands it out. The spans point into the
  // slice and are valid only during the visitor call.
  struct SliceView {
    uint32_t index = 0;
    uint64_t version = 0;
    absl::Span<const float> values;
    // SliceOptimizer::state(): one span per state buffer, each values.size().
    std::vector<absl::Span<const float>> optimizer_state;
  };
  // Called under the slice's lock, so it must copy and return without
  // blocking (like SliceSink).
  using SliceVisitor = absl::FunctionRef<void(const SliceView& slice)>;
  using TensorVisitor = absl::FunctionRef<absl::Status(
      const TensorSpec& spec, absl::Span<const Slice* const> local_slices)>;

  // Calls visit(spec, local slices in index order) for every tensor, in name
  // order, with no lock held; stops at the first error visit returns. The
  // visitor reads slices with ReadSlice, each under its own lock, so every
  // slice read is internally consistent (values, optimizer state and version
  // agree) while pushes go on between reads; the versions say exactly which
  // updates each slice holds. A tensor created during the walk may be missed.
  absl::Status ForEachTensor(TensorVisitor visit) const;
  // Hands one slice's state to visit under the slice's lock.
  static void ReadSlice(const Slice* slice, SliceVisitor visit);

  // Adds a tensor whose local slices are then filled by RestoreSlice: the
  // spec is validated like CreateTensors does, but slices start at zero
  // with version 0 instead of being initialized. FAILED_PRECONDITION if a
  // tensor of that name exists.
  absl::Status RestoreTensor(const TensorSpec& spec);

  // Sets a local slice's version, values and optimizer state from
  // little-endian float32 bytes. INVALID_ARGUMENT (naming the slice) unless
  // the tensor exists, the slice lives here, and the values and the state
  // buffers (as many as the tensor's optimizer keeps) have the slice's size.
  absl::Status RestoreSlice(const std::string& tensor, uint32_t index,
                            uint64_t version, absl::string_view values,
                            absl::Span<const absl::string_view> optimizer_state);

 private:
  struct Tensor;

  explicit ShardStore(const ShardStoreOptions& options);
  absl::StatusOr<TensorSpec> Resolve(const TensorSpec& spec) const;
  // Validates the pull; hands slices out only when sink is not null.
  absl::Status PullInto(const PullRequest& request,
                        const SliceSink* sink) const;
  const Tensor* FindTensor(const std::string& name) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const ShardStoreOptions options_;

  mutable absl::Mutex mu_;
  // Tensors are never removed, so Tensor and Slice pointers stay valid for
  // the life of the store.
  absl::flat_hash_map<std::string, std::unique_ptr<Tensor>> tensors_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_SHARD_STORE_H_
