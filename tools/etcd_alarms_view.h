#ifndef ASYNCPS_TOOLS_ETCD_ALARMS_VIEW_H_
#define ASYNCPS_TOOLS_ETCD_ALARMS_VIEW_H_

// psctl status's view of the alarms etcd raised (for a run found with
// --etcd_endpoints): an etcd whose database reached its quota (NOSPACE)
// refuses every write, so no failover, backup change or joining server can
// happen, while everything else looks as usual. Status names the alarm and
// what to do, and exits non-zero while one is raised.
//
//   etcd: alarm NOSPACE raised by member 8e9e05c52164694d: etcd refuses
//   every write (no failover, ...) until ... (etcdctl compact, defrag,
//   alarm disarm)

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "membership/etcd_client.h"
#include "tools/doc.h"

namespace asyncps {

struct EtcdAlarmsView {
  bool read = false;  // false: no etcd (nothing shown)
  absl::StatusOr<std::vector<EtcdClient::Alarm>> alarms =
      std::vector<EtcdClient::Alarm>();
};

// The alarms raised in `etcd` (null: no etcd).
EtcdAlarmsView ReadEtcdAlarms(EtcdClient* etcd);

// Whether an alarm is raised (a failed read raises none: etcd's own
// reachability shows elsewhere).
bool AlarmRaised(const EtcdAlarmsView& view);

// A line per alarm, and one when the read failed ("" when none was raised
// or there is no etcd); the document psctl status -o json|yaml adds
// ("etcd_alarms": an array, or a string saying why it was not read; null
// without etcd).
std::string EtcdAlarmsText(const EtcdAlarmsView& view);
Doc EtcdAlarmsDoc(const EtcdAlarmsView& view);

}  // namespace asyncps

#endif  // ASYNCPS_TOOLS_ETCD_ALARMS_VIEW_H_
