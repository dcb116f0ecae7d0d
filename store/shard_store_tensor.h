#ifndef ASYNCPS_STORE_SHARD_STORE_TENSOR_H_
#define ASYNCPS_STORE_SHARD_STORE_TENSOR_H_

// ShardStore's record of one dense tensor, shared by the files of the store
// (shard_store.cc: creation, pulls, pushes; shard_store_state.cc: export,
// restore, slot moves). Internal to //store:shard_store.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/tensor_layout.h"
#include "proto/asyncps.pb.h"
#include "store/dense_slice.h"
#include "store/lr_schedule.h"
#include "store/shard_store.h"

namespace asyncps {

// Bookkeeping per slice beyond its values and state (the DenseSlice, its
// optimizer object and allocator headers), and per slice-table entry.
inline constexpr uint64_t kSliceOverheadBytes = 256;
inline constexpr uint64_t kTableEntryBytes = sizeof(void*);

// Fields other than the spec, layout and schedule are guarded by the
// store's mu_ (read shared, changed exclusively).
struct ShardStore::Tensor {
  TensorSpec spec;  // as created: no schedule
  TensorLayout layout;
  int optimizer_buffers = 0;
  // The slices this shard owns under the map served now, by slice index;
  // null where another shard is the home.
  std::vector<std::unique_ptr<DenseSlice>> slices;
  uint64_t reserved_bytes = 0;  // counted against max_parameter_bytes
  std::unique_ptr<LrSchedule> schedule;
  // Slices of slots another shard owns, imported by a slot move
  // (ImportSlice) and not served until AdoptMap gives them to this shard.
  // Their bytes are in reserved_bytes.
  absl::flat_hash_map<uint32_t, std::unique_ptr<DenseSlice>> incoming;

  // The spec with its schedule, as listed, checkpointed and journaled.
  TensorSpec Listed() const {
    TensorSpec out = spec;
    schedule->Annotate(out.mutable_optimizer());
    return out;
  }

  // What slice `index` counts against max_parameter_bytes: its values and
  // optimizer state, and its bookkeeping.
  uint64_t SliceBytes(uint32_t index) const {
    return static_cast<uint64_t>(layout.SliceSize(index)) *
               (1 + static_cast<uint64_t>(optimizer_buffers)) * sizeof(float) +
           kSliceOverheadBytes;
  }
};

}  // namespace asyncps

#endif  // ASYNCPS_STORE_SHARD_STORE_TENSOR_H_
