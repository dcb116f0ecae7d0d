#ifndef ASYNCPS_SERVER_MAP_RECOVERY_H_
#define ASYNCPS_SERVER_MAP_RECOVERY_H_

// Puts a replicated run's shard map back when etcd lost it: etcd restarted
// without its data directory (a one-member etcd on a temporary directory, a
// pod without its volume), or somebody deleted the key. The servers still
// hold the run (every replica its state and its role); only the map that
// says who holds what is gone, and without it every replica waited for
// ever, acknowledging nothing (their leases went with etcd's data, and a
// replica confirms its role in the map before it resumes).
//
// The map is lost when the run's map key is missing, holds something that
// is no map, or holds an older epoch than one this process has seen (a
// server started meanwhile wrote a new run's first map there: epochs only
// ever grow). Each replica that
// finds it lost then offers the newest map it saw (MapStore::newest)
// under `<prefix>/recovery/<its id>`, with its lease, so that the offer
// goes with the process; once the map has been lost for `settle` (time
// for the other live replicas to hold new leases and offer theirs), one
// writes the newest map offered, at the next epoch, over what is at the
// key (compare-and-swap: one writer wins). Each replica then confirms its
// role in it as after a lost lease (ReplicaGroup::Rejoin), and clients,
// which follow the map by epoch, route by it.
//
// What it cannot know: a map change that no live process saw (its writer
// died with etcd's data, before the watch brought it to anyone). Losing
// etcd's data is outside what replication protects against; the newest map
// any live replica saw is the best left, and with every writer of a change
// alive (the usual case: etcd lost, the servers running) it is the last
// map etcd held.
//
// Example (the role thread, while its map is lost):
//
//   MapRecovery recovery(etcd, maps, prefix, self, logger);
//   absl::StatusOr<MapStore::Read> read = maps->Get();
//   if (recovery.Lost(read)) {
//     recovery.Step(read, lease_id);
//     return;  // look again at the next tick
//   }
//   recovery.Found();
//
// Thread-compatible: one thread (the replica's role thread) calls it.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "membership/etcd_client.h"
#include "membership/map_store.h"
#include "spdlog/spdlog.h"

namespace asyncps {

class MapRecovery {
 public:
  // None of the pointers is owned; all outlive the recovery.
  MapRecovery(EtcdClient* etcd, MapStore* maps, const std::string& prefix,
              std::string self, std::shared_ptr<spdlog::logger> logger,
              absl::Duration settle = absl::Seconds(3));

  // Whether `read` (MapStore::Get's answer) says the map was lost: no map
  // at the key, a value there that is no map (DATA_LOSS), or a map older
  // than the newest this process saw.
  bool Lost(const absl::StatusOr<MapStore::Read>& read) const;

  // One look while the map is lost (`read`: what Lost was given): offers
  // the newest map seen, under lease `lease_id`; a later look, once
  // `settle` has passed since the first, writes the newest offered at the
  // next epoch over what is at the key, unless that is a map of that epoch
  // or newer already (another replica put it back). Errors are etcd's; the
  // next look tries again.
  absl::Status Step(const absl::StatusOr<MapStore::Read>& read,
                    int64_t lease_id);

  // The map is there again: withdraws the offer (once per loss).
  void Found();

 private:
  EtcdClient* const etcd_;
  MapStore* const maps_;
  const std::string offers_;  // "<prefix>/recovery/"
  const std::string self_;
  const std::shared_ptr<spdlog::logger> logger_;
  const absl::Duration settle_;
  absl::Time lost_since_ = absl::InfiniteFuture();  // monotonic
  int64_t offered_under_ = 0;  // the lease of the offer made, 0: none
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_MAP_RECOVERY_H_
