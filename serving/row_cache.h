#ifndef ASYNCPS_SERVING_ROW_CACHE_H_
#define ASYNCPS_SERVING_ROW_CACHE_H_

// Sparse rows for serving: a batch's ids are de-duplicated and looked up in
// a bounded cache of hot rows; the misses are read from the parameter
// source in one call per table (without creating rows) and cached. The
// cache belongs to one parameter snapshot: the first lookup with a newer
// snapshot re-reads the rows that were used under the previous one (at
// most `capacity`, in one call per table) and drops the rest, so hot rows
// are refreshed with the snapshot and cold ones age out.
//
// Thread-safe (one lock; a batch's misses are read under it).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "serving/parameter_source.h"

namespace asyncps {

class RowCache {
 public:
  // `source` is not owned. `capacity` rows per table are kept (>= 1).
  RowCache(ParameterSource* source, size_t capacity)
      : source_(source), capacity_(capacity) {}

  // The rows of `ids` (repeats allowed) of `table` (dim floats each) into
  // out, in order, as of snapshot `snapshot_id` or later. Errors of the
  // source.
  absl::Status Lookup(uint64_t snapshot_id, const std::string& table, int dim,
                      absl::Span<const uint64_t> ids, float* out);

  struct Stats {
    uint64_t hits = 0;
    uint64_t misses = 0;     // rows read from the source for a lookup
    uint64_t refreshed = 0;  // hot rows re-read for a new snapshot
  };
  Stats stats() const;

 private:
  struct Table {
    int dim = 0;
    absl::flat_hash_map<uint64_t, uint32_t> slot;  // id -> row index
    std::vector<uint64_t> ids;                     // per row index
    std::vector<float> values;                     // rows x dim
    std::vector<bool> used;  // looked up under the current snapshot
  };
  // Moves to `snapshot_id`: re-reads the used rows of every table.
  absl::Status Advance(uint64_t snapshot_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ParameterSource* const source_;
  const size_t capacity_;
  mutable absl::Mutex mu_;
  uint64_t snapshot_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, Table> tables_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVING_ROW_CACHE_H_
