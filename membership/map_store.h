#ifndef ASYNCPS_MEMBERSHIP_MAP_STORE_H_
#define ASYNCPS_MEMBERSHIP_MAP_STORE_H_

// The shard map of a replicated run in etcd: one key, `<prefix>/map`,
// holding a ShardMapRecord (proto/membership.proto). Every change goes
// through Update: the change is applied to the map as read, and written
// with the epoch advanced by one only if nobody wrote the key since (etcd
// compare-and-swap on its revision), else read again and retried. So the
// epochs of a run are 1, 2, 3, ... with no gaps and no two maps of one
// epoch, and a change made from an old map can never overwrite a newer one.
//
// Example:
//
//   MapStore maps(etcd.get(), "/asyncps/run-7");
//   absl::StatusOr<ShardMapRecord> map = maps.Initialize(initial);  // epoch 1
//   // Promote shard 0's first caught-up backup when its primary is gone.
//   map = maps.Update([&](ShardMapRecord* m) -> absl::StatusOr<bool> {
//     return PromoteBackup(m->mutable_groups(0), dead_address);
//   });
//   auto watch = maps.Watch(map_revision + 1, [](const ShardMapRecord& m) {
//     ... route by m from now on ...
//   }, nullptr);
//
// Thread-safe (as EtcdClient).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "membership/etcd_client.h"
#include "proto/membership.pb.h"

namespace asyncps {

// The etcd prefix every key of run `run_id` lives under:
// "/asyncps/<run_id>".
std::string RunPrefix(absl::string_view run_id);

class MapStore {
 public:
  // `etcd` is not owned and outlives the store; `prefix` is the run's
  // ("/asyncps/<run_id>").
  MapStore(EtcdClient* etcd, std::string prefix);

  // The key the map lives at.
  const std::string& key() const { return key_; }

  // Writes `initial` at epoch 1 unless a map exists; returns the map in
  // force. A map of another run, shard count or R at the prefix is
  // FAILED_PRECONDITION (two runs on one prefix); a malformed `initial`
  // INVALID_ARGUMENT.
  absl::StatusOr<ShardMapRecord> Initialize(ShardMapRecord initial);

  // The map in force and the etcd revision of its key (NOT_FOUND when
  // there is none).
  struct Read {
    ShardMapRecord map;
    int64_t mod_revision = 0;
  };
  absl::StatusOr<Read> Get();

  // Applies `change` to the map in force and writes the result at the next
  // epoch, atomically; on a concurrent write, reads again and reapplies,
  // at most `max_attempts` times (ABORTED after). `change` returns false
  // to write nothing (the map is returned as it is), or an error (returned,
  // nothing written). The changed map must stay well-formed (same run,
  // shard count and R; INVALID_ARGUMENT otherwise, nothing written).
  using Change = std::function<absl::StatusOr<bool>(ShardMapRecord*)>;
  absl::StatusOr<ShardMapRecord> Update(const Change& change,
                                        int max_attempts = 16);

  // Calls `on_map` with every map written at or after etcd revision
  // `from_revision`, in epoch order, on the watch's thread; `on_end` as
  // EtcdClient::WatchPrefix's. The watcher must go before this store and
  // its client.
  std::unique_ptr<EtcdClient::Watcher> Watch(
      int64_t from_revision, std::function<void(const ShardMapRecord&)> on_map,
      std::function<void(const absl::Status&)> on_end);

  // Writes `map` as it is (its own epoch) if the key's revision is still
  // `mod_revision` (0: no map there); whether it was written. For putting
  // back a map that etcd lost (server/map_recovery.h): every other change
  // goes through Update. INVALID_ARGUMENT (nothing written) as Check.
  absl::StatusOr<bool> Replace(const ShardMapRecord& map, int64_t mod_revision);

  // The map of the highest epoch this store has read or written (epoch 0
  // before any), and Saw(map) for one read elsewhere (a watch): what this
  // process knew of the run when etcd lost the map.
  ShardMapRecord newest() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t newest_epoch() const ABSL_LOCKS_EXCLUDED(mu_);
  void Saw(const ShardMapRecord& map) ABSL_LOCKS_EXCLUDED(mu_);

  // INVALID_ARGUMENT unless `map` has num_shards >= 1 groups numbered in
  // order, R >= 1, no address twice, and an epoch >= 1.
  static absl::Status Check(const ShardMapRecord& map);

 private:
  EtcdClient* const etcd_;
  const std::string key_;
  mutable absl::Mutex mu_;
  ShardMapRecord newest_ ABSL_GUARDED_BY(mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_MEMBERSHIP_MAP_STORE_H_
