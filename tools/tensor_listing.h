#ifndef ASYNCPS_TOOLS_TENSOR_LISTING_H_
#define ASYNCPS_TOOLS_TENSOR_LISTING_H_

// What `psctl tensors` prints: the tensors and sparse tables the shards
// hold, one row per name with the shards that list it (a spec that differs
// between shards is marked MISMATCH), as a table (wide: with init values,
// seeds, learning rates and momenta) or one JSON / YAML document.

#include <vector>

#include "tools/psctl_output.h"
#include "tools/shard_query.h"

namespace asyncps {

// Prints `results` (every shard's ListTensors answer; a DOWN one's error as
// it is to be shown) in `format` on stdout. Returns 0, or kExitDown when a
// shard did not answer.
int PrintTensors(const std::vector<TensorListResult>& results, Format format);

}  // namespace asyncps

#endif  // ASYNCPS_TOOLS_TENSOR_LISTING_H_
