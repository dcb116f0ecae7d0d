#ifndef ASYNCPS_STORE_DENSE_SLICE_H_
#define ASYNCPS_STORE_DENSE_SLICE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/payload.h"
#include "common/tensor_layout.h"
#include "proto/asyncps.pb.h"
#include "store/change_epoch.h"
#include "store/optimizer.h"
#include "store/staleness_rule.h"

namespace asyncps {

// One slice of a dense tensor held by a shard: its values, its version (the
// updates applied so far) and its optimizer's state, under one lock, so
// that pulls, pushes and checkpoints of different slices never contend.
// ShardStore owns one per local slice and checks requests before they get
// here: a slice applies what it is given.
//
//   DenseSlice slice(spec, layout, /*index=*/3, /*initialize=*/true, nullptr);
//   SliceResult result;
//   slice.Apply(gradient, /*read_version=*/0, rule, /*lr_factor=*/1, &result);
//   slice.CopyOut("w", [](const std::string& tensor, uint32_t index,
//                         uint64_t version, absl::Span<const float> values) {
//     ...  // copy the values; they are valid only during the call
//   });
//
// Thread-safe.
class DenseSlice {
 public:
  // The slice's whole state as Read hands it out; the spans point into the
  // slice and are valid only during the call.
  struct View {
    uint32_t index = 0;
    uint64_t version = 0;
    uint32_t changed = 0;  // see changed()
    absl::Span<const float> values;
    // SliceOptimizer::state(): one span per state buffer, each values.size().
    std::vector<absl::Span<const float>> optimizer_state;
  };

  // Receives a slice's tensor name, index, version and values under its
  // lock: it must copy and return without blocking.
  using Sink =
      absl::FunctionRef<void(const std::string& tensor, uint32_t slice,
                             uint64_t version, absl::Span<const float> values)>;

  // Slice `index` of a tensor of `spec` cut as `layout`. `initialize` false
  // leaves the values at zero (a restore fills them); otherwise they come
  // from `given` (the whole tensor's values, for INIT_VALUES) when it is not
  // null, else from the spec's initializer.
  DenseSlice(const TensorSpec& spec, const TensorLayout& layout, uint32_t index,
             bool initialize, const float* given);

  uint32_t index() const { return index_; }
  int64_t size() const { return size_; }

  uint64_t version() const;

  // Hands `tensor` (the slice's tensor's name), index, version and values
  // to sink under the lock.
  void CopyOut(const std::string& tensor, const Sink& sink) const;

  // Applies g unless staler than the rule allows, with the learning rate
  // scaled by the rule and by `lr_factor` (the schedule's); fills `result`
  // (outcome, staleness, new version, lr scale). Stamps the slice changed
  // in epoch.current() read under the slice's lock, so that a capture that
  // advanced the epoch and then read the slice either saw this change or
  // finds it stamped with its epoch or a later one. REQUIRES: read_version
  // <= version() (a read version from the future is refused before).
  void Apply(const Payload& g, uint64_t read_version, const StalenessRule& rule,
             float lr_factor, const ChangeEpoch& epoch, SliceResult* result);

  // Replaces the values with `values` (PushRequest.assign: the optimizer's
  // state is kept) and bumps the version; fills `result`; stamps as Apply.
  void Assign(const Payload& values, const ChangeEpoch& epoch,
              SliceResult* result);

  // Hands the whole state to visit under the lock; returns what it returns.
  absl::Status Read(absl::FunctionRef<absl::Status(const View&)> visit) const;

  // Sets the version, values and optimizer state from little-endian float32
  // bytes. REQUIRES: values and every state buffer hold size() floats, and
  // there are as many buffers as the optimizer keeps.
  void Import(uint64_t version, absl::string_view values,
              absl::Span<const absl::string_view> state);

  size_t optimizer_bytes() const;

  // The ChangeEpoch (store/change_epoch.h) of the slice's last change, as
  // its owner stamped it with MarkChanged after applying a push (a relaxed
  // store: no lock). 0 = never stamped.
  uint32_t changed() const { return changed_.load(std::memory_order_relaxed); }
  void MarkChanged(uint32_t epoch) {
    changed_.store(epoch, std::memory_order_relaxed);
  }

 private:
  // Const after construction.
  const uint32_t index_;
  const int64_t size_;
  std::atomic<uint32_t> changed_{0};

  mutable absl::Mutex mu_;
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<float> values_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<SliceOptimizer> optimizer_ ABSL_GUARDED_BY(mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_STORE_DENSE_SLICE_H_
