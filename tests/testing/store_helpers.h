#ifndef ASYNCPS_TESTS_TESTING_STORE_HELPERS_H_
#define ASYNCPS_TESTS_TESTING_STORE_HELPERS_H_

// Short forms of store and checkpoint operations for tests and benchmarks.

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "server/checkpoint.h"
#include "store/shard_store.h"

namespace asyncps {
namespace testing {

// Prepares and commits a protobuf push (payloads in SliceGradient.grad and
// RowsGradient.grad).
inline absl::Status ApplyPush(ShardStore* store, const PushRequest& request,
                              const StalenessRule& rule, PushResponse* response,
                              PushMode mode = PushMode::kApply) {
  const std::vector<Payload> grads = ShardStore::PayloadsOf(request);
  const std::vector<Payload> rows = TableStore::PayloadsOf(request);
  absl::StatusOr<ShardStore::PreparedPush> prepared =
      store->PreparePush(request, grads, rows, mode);
  if (!prepared.ok()) return prepared.status();
  store->CommitPush(&*prepared, rule, response);
  return absl::OkStatus();
}

// Captures the store (no workers) now and writes its checkpoint to `dir`.
inline absl::StatusOr<CheckpointInfo> WriteStoreCheckpoint(
    const ShardStore& store, const std::string& dir,
    const std::string& build_version = "") {
  return WriteCheckpoint(
      CaptureCheckpoint(store, {}, absl::Now(), build_version), dir);
}

// Restores a checkpoint into `store`, returning its info.
inline absl::StatusOr<CheckpointInfo> RestoreStoreCheckpoint(
    const std::string& path, ShardStore* store) {
  absl::StatusOr<RestoredCheckpoint> r = RestoreCheckpoint(path, store);
  if (!r.ok()) return r.status();
  return r->info;
}

}  // namespace testing
}  // namespace asyncps

#endif  // ASYNCPS_TESTS_TESTING_STORE_HELPERS_H_
