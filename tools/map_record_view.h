#ifndef ASYNCPS_TOOLS_MAP_RECORD_VIEW_H_
#define ASYNCPS_TOOLS_MAP_RECORD_VIEW_H_

// psctl status's view of a slotted run's map record (server/map_keeper.h):
// the epoch of the last committed move and the move that holds the next
// one, so that an operator sees why a move is refused ("another map change
// is in progress") and which shard to look at. Read from etcd for a run
// with --etcd_endpoints, else from the keeper shard (shard 0).
//
//   map record (shard 0 at h:p): epoch 4; a move holds epoch 5: shard 3
//   (h:p) moving 16 slots in from shard 1
//
// A static run has none (nothing shown).

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/security.h"
#include "membership/etcd_client.h"
#include "proto/slot_moves.pb.h"
#include "tools/doc.h"
#include "tools/status_table.h"

namespace asyncps {

struct MapRecordView {
  bool slotted = false;  // else there is nothing to show
  std::string where;     // "etcd key ..." / "shard 0 at h:p"
  absl::StatusOr<VersionedMapRecord> record = VersionedMapRecord();
};

// Reads the record of the run the shards in `results` serve: from `etcd`
// (null: no etcd) or from shard 0 within `timeout`.
MapRecordView ReadMapRecordView(const std::vector<ShardResult>& results,
                                EtcdClient* etcd,
                                const SecurityOptions& security,
                                absl::Duration timeout);

// One line (with its newline; "" when not slotted), and the document
// psctl status -o json|yaml adds ("map_record"; null when not slotted).
std::string MapRecordText(const MapRecordView& view);
Doc MapRecordDoc(const MapRecordView& view);

}  // namespace asyncps

#endif  // ASYNCPS_TOOLS_MAP_RECORD_VIEW_H_
