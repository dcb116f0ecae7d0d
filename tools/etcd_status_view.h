#ifndef ASYNCPS_TOOLS_ETCD_STATUS_VIEW_H_
#define ASYNCPS_TOOLS_ETCD_STATUS_VIEW_H_

// psctl status's view of what etcd says beside the shard map (a run found
// with --etcd_endpoints):
//
// - the alarms etcd raised: an etcd whose database reached its quota
//   (NOSPACE) refuses every write, so no failover, backup change or
//   joining server can happen, while everything else looks as usual.
//   Status names the alarm and what to do, and exits non-zero while one is
//   raised.
// - the standby replicas: server processes registered in the run (a key under
//   <prefix>/members/ that says so), listed in no group of the map; each
//   waits until its shard's group lists fewer than R replicas
//   (server/replica_group.h).
// - the lost groups: groups that held a state and have no caught-up
//   replica alive, with the replicas whose checkpoints hold their last
//   state (the map names their checkpoint directories); only a process on
//   one of those claims such a group unless told otherwise.
//
//   etcd: alarm NOSPACE raised by member 8e9e05c52164694d: etcd refuses
//   every write (no failover, ...) until ... (etcdctl compact, defrag,
//   alarm disarm)
//   standby replica: 10.0.0.7:7000 (host node-3) waits to join shard 0
//   shard 1 lost every replica holding its state: its last state is in
//   the checkpoints of 10.0.0.8:7000 (a process on one of their
//   --checkpoint_dir claims it; ...)

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "membership/etcd_client.h"
#include "membership/map_router.h"
#include "tools/doc.h"

namespace asyncps {

struct EtcdStatusView {
  bool read = false;  // false: no etcd (nothing shown)
  absl::StatusOr<std::vector<EtcdClient::Alarm>> alarms =
      std::vector<EtcdClient::Alarm>();
  struct Standby {
    std::string address;
    std::string host;  // its placement label
    int shard = -1;    // the group it waits for; -1: any
  };
  absl::StatusOr<std::vector<Standby>> standbys = std::vector<Standby>();
  struct LostGroup {
    int shard = 0;
    // The caught-up replicas the map still lists whose checkpoint
    // directories it names (none: any process of the shard with a
    // checkpoint claims the group).
    std::vector<std::string> holders;
  };
  absl::StatusOr<std::vector<LostGroup>> lost_groups = std::vector<LostGroup>();
};

// The alarms raised in `etcd`, the run's standing-by processes (the
// members of the run `router` follows that its map lists nowhere) and its
// lost groups (null `etcd`: no etcd; null `router`: neither read).
EtcdStatusView ReadEtcdStatus(EtcdClient* etcd, const MapRouter* router);

// Whether an alarm is raised (a failed read raises none: etcd's own
// reachability shows elsewhere).
bool AlarmRaised(const EtcdStatusView& view);

// A line per alarm, per standby and per lost group, and one for a read
// that failed ("" when there is nothing to say or no etcd); what psctl
// status -o json|yaml adds to `doc`: "etcd_alarms" (an array, or a string
// saying why it was not read; null without etcd), "standby_replicas" and
// "lost_groups" ({shard, last_state_holders}; likewise).
std::string EtcdStatusText(const EtcdStatusView& view);
void AddEtcdStatusDoc(const EtcdStatusView& view, Doc* doc);

}  // namespace asyncps

#endif  // ASYNCPS_TOOLS_ETCD_STATUS_VIEW_H_
