#ifndef ASYNCPS_WORKER_LOCAL_STORE_H_
#define ASYNCPS_WORKER_LOCAL_STORE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/parameter_store.h"

namespace asyncps {

// The tensors and tables in this process: one shard of one
// (store/shard_store.h), no RPC, no consistency waits. Pulls and pushes run
// to completion when started, through the same validation, optimizer and
// push-transaction code as a shard (a step's tensors and rows are applied
// together or not at all); the caller's buffers are read and written
// directly, with no encoding. The --local baseline of ps_worker.
// Thread-compatible.
absl::StatusOr<std::unique_ptr<ParameterStore>> MakeLocalStore();

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_LOCAL_STORE_H_
