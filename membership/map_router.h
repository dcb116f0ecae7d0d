#ifndef ASYNCPS_MEMBERSHIP_MAP_ROUTER_H_
#define ASYNCPS_MEMBERSHIP_MAP_ROUTER_H_

// A ShardRouter (common/shard_router.h) that follows a replicated run's
// shard map in etcd (membership/map_store.h): each shard's address is its
// group's first replica, the primary. Workers (ps_worker), ps_serve and
// psctl give one to their PsClient (PsClientOptions::router), so that a
// failover moves their calls to the new primary without a restart.
//
// Example:
//
//   MapRouterOptions o;
//   o.logger = logger;
//   absl::StatusOr<std::shared_ptr<MapRouter>> router =
//       MapRouter::Connect({"10.0.0.9:2379"}, "run-7", o);
//   if (!router.ok()) return router.status();  // says what to fix
//   PsClientOptions c;
//   c.router = *router;                         // servers come from the map
//
// The router reads the map once at start (waiting for one to appear), then
// watches its key; when the watch ends (etcd restarting, unreachable, the
// revision compacted) it reads the map again and watches anew, with
// backoff, for as long as it lives. Maps are applied in epoch order; one of
// an older epoch than the one applied is ignored.
//
// Thread-safe.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/security.h"
#include "common/shard_router.h"
#include "membership/etcd_client.h"
#include "membership/map_store.h"
#include "proto/membership.pb.h"
#include "spdlog/spdlog.h"

namespace asyncps {

struct MapRouterOptions {
  // At start, wait this long for the map to appear (the run's shards write
  // it when they start); NOT_FOUND after.
  absl::Duration wait_for_map = absl::Seconds(30);
  // Between a watch that ended and the next read of the map: doubling from
  // the first to the second while etcd does not answer.
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(2);
  // Deadline of each etcd call (Connect only; Start uses the client's).
  absl::Duration etcd_call_timeout = absl::Seconds(5);
  // How etcd is reached (Connect only).
  EtcdAccess etcd_access;
  // Primaries that moved and watches that ended are logged here; null =
  // not logged.
  std::shared_ptr<spdlog::logger> logger;
};

class MapRouter : public ShardRouter {
 public:
  // Reads the map at `prefix` through `etcd` (waiting up to
  // options.wait_for_map for one), then follows it. UNAVAILABLE (or
  // DEADLINE_EXCEEDED) when etcd does not answer; NOT_FOUND when no map
  // appeared; both name the key.
  static absl::StatusOr<std::shared_ptr<MapRouter>> Start(
      std::shared_ptr<EtcdClient> etcd, std::string prefix,
      MapRouterOptions options);

  // Start on a new client of `endpoints` ("host:port") at
  // RunPrefix(run_id); errors also name the endpoints and what to check.
  static absl::StatusOr<std::shared_ptr<MapRouter>> Connect(
      const std::vector<std::string>& endpoints, absl::string_view run_id,
      MapRouterOptions options);

  // Stops following (joins the watch and its thread).
  ~MapRouter() override;
  MapRouter(const MapRouter&) = delete;
  MapRouter& operator=(const MapRouter&) = delete;

  int num_shards() const override { return num_shards_; }
  std::string Address(int shard) const override;
  uint64_t generation() const override {
    return generation_.load(std::memory_order_acquire);
  }

  // The map last applied (its epoch: map().epoch()).
  ShardMapRecord map() const;
  // The key followed ("<prefix>/map").
  const std::string& key() const { return store_.key(); }
  // The etcd client it reads through (psctl reads the run's other keys).
  EtcdClient* etcd() const { return etcd_.get(); }

 private:
  MapRouter(std::shared_ptr<EtcdClient> etcd, std::string prefix,
            MapRouterOptions options, const ShardMapRecord& first);

  // The map and the store revision it was read at (a watch from the next
  // revision misses nothing); NOT_FOUND when there is none.
  static absl::StatusOr<ShardMapRecord> ReadMap(EtcdClient* etcd,
                                                const std::string& key,
                                                int64_t* revision);
  // Takes `map` when its epoch is newer than the one applied; advances the
  // generation when an address changed.
  void Apply(const ShardMapRecord& map);
  bool StoppedOrEnded() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || watch_ended_;
  }
  // The follower thread: watch, and when the watch ends, read and watch
  // again after a backoff, until stopped.
  void Follow(int64_t from_revision);
  // Sleeps `d` or until stopped; false when stopped.
  bool Pause(absl::Duration d);

  // Const after construction.
  const std::shared_ptr<EtcdClient> etcd_;  // outlives store_ and watches
  MapStore store_;
  const MapRouterOptions options_;
  const int num_shards_;

  std::atomic<uint64_t> generation_{1};
  mutable absl::Mutex mu_;
  ShardMapRecord map_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> addresses_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool watch_ended_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status watch_end_ ABSL_GUARDED_BY(mu_);  // why it ended
  std::thread follower_;  // last: started once the rest is set
};

}  // namespace asyncps

#endif  // ASYNCPS_MEMBERSHIP_MAP_ROUTER_H_
