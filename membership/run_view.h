#ifndef ASYNCPS_MEMBERSHIP_RUN_VIEW_H_
#define ASYNCPS_MEMBERSHIP_RUN_VIEW_H_

// A replicated run's shard map and live members as one server process's
// role thread looks at them every tick (server/replica_group.h), kept by
// one watch on the run's prefix in etcd instead of two linearizable reads
// per tick: a run of P server processes cost etcd 20 P reads a second
// (77 a second for deploy/local.sh --replicas 2), and a thousand
// processes would cost it 20,000.
//
// The view is listed once (one read of the whole prefix: the map key and
// the members' keys), then follows the watch's events; it is listed again
// whenever the watch ended (etcd restarted or silent: the watch asks etcd
// for progress when it has heard nothing for the client's
// watch_check_every and ends when that goes unanswered for its
// call_timeout; the member it reads from without a leader; the revision
// compacted), with a new watch then, and every `relist_every` (a net under
// the watch). A listing reads every member's key, so listing every second,
// as the view did while the watch had no check of its own, cost etcd P
// keys a second per process: P^2 for a run of P processes. An event at or
// below the revision the view already holds is skipped, so a listing and
// the watch never undo one another. Decisions made from the view stay safe
// when it lags: every change of the map is a compare-and-swap on the map
// read again (MapStore::Update), and leases fence the processes
// themselves.
//
// Example:
//
//   RunView view(etcd.get(), RunPrefix("run-7"));
//   absl::StatusOr<RunView::Snapshot> now = view.Read();
//   if (!now.ok()) return;  // etcd unreachable: look again at the next tick
//   bool alive = now->live.contains(id);
//
// Thread-safe.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "membership/etcd_client.h"
#include "proto/membership.pb.h"

namespace asyncps {

class RunView {
 public:
  // `etcd` is not owned and outlives the view; `prefix` is the run's
  // (RunPrefix). Nothing is read before the first Read.
  RunView(EtcdClient* etcd, std::string prefix,
          absl::Duration relist_every = absl::Minutes(1));
  // Ends the watch.
  ~RunView();
  RunView(const RunView&) = delete;
  RunView& operator=(const RunView&) = delete;

  struct Snapshot {
    ShardMapRecord map;
    // The ids of the members whose keys exist (<prefix>/members/<id>).
    absl::flat_hash_set<std::string> live;
  };
  // The view now: as the watch left it, or a new listing when none is
  // fresh (its error then: UNAVAILABLE when etcd does not answer,
  // NOT_FOUND when the run has no map, DATA_LOSS for one that does not
  // parse).
  absl::StatusOr<Snapshot> Read() ABSL_LOCKS_EXCLUDED(mu_, list_mu_);

  // Listings made so far (each one read of etcd).
  int64_t listings() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::StatusOr<Snapshot> List() ABSL_EXCLUSIVE_LOCKS_REQUIRED(list_mu_)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Apply(uint64_t generation, const std::vector<EtcdEvent>& events)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Ended(uint64_t generation) ABSL_LOCKS_EXCLUDED(mu_);

  EtcdClient* const etcd_;
  const std::string prefix_;
  const std::string map_key_;
  const std::string members_;  // "<prefix>/members/"
  const absl::Duration relist_every_;

  // One listing at a time; taken before mu_.
  absl::Mutex list_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  Snapshot view_ ABSL_GUARDED_BY(mu_);
  bool listed_ ABSL_GUARDED_BY(mu_) = false;  // view_ holds a listing
  // The newest etcd revision view_ holds (listing or event).
  int64_t revision_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time listed_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // The watch's number; events and ends of an older one are ignored.
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool watching_ ABSL_GUARDED_BY(mu_) = false;  // the watch has not ended
  int64_t listings_ ABSL_GUARDED_BY(mu_) = 0;
  // Replaced under list_mu_ only (its callbacks take mu_).
  std::unique_ptr<EtcdClient::Watcher> watcher_ ABSL_GUARDED_BY(list_mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_MEMBERSHIP_RUN_VIEW_H_
