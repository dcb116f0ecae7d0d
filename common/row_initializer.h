#ifndef ASYNCPS_COMMON_ROW_INITIALIZER_H_
#define ASYNCPS_COMMON_ROW_INITIALIZER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

// Checks the initializer fields of a table spec: INIT_ZEROS, INIT_CONSTANT,
// INIT_UNIFORM or INIT_NORMAL, init_value finite (and >= 0 as the scale of
// the random ones). The message names the table.
absl::Status ValidateRowInitializer(const TableSpec& spec);

// The initial values of the rows of one sparse table. Counter-based: value
// j of row `id` is a hash of (seed, table name, id, j) turned into a number
// (SplitMix64; Box-Muller for INIT_NORMAL), so a row's values are a pure
// function of (spec, id), whatever the order rows are created in, on any
// shard, after any restart, and a worker can compute them too.
//
// Thread-safe (immutable).
class RowInitializer {
 public:
  // REQUIRES: ValidateRowInitializer(spec).ok().
  explicit RowInitializer(const TableSpec& spec);

  // Writes the dim values of row `id` to out[0, dim).
  void Fill(uint64_t id, float* out) const;

 private:
  // The j-th 64 random bits of row `id`.
  uint64_t Bits(uint64_t id, uint64_t j) const;

  const Initializer init_;
  const float value_;
  const int dim_;
  const uint64_t key_;  // seed and table name
};

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_ROW_INITIALIZER_H_
