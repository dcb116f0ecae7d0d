#ifndef ASYNCPS_SERVER_ETCD_MAP_RECORD_H_
#define ASYNCPS_SERVER_ETCD_MAP_RECORD_H_

// A run's map record (server/map_record_store.h) in etcd, for a run with
// --etcd_endpoints: one key, "<run prefix>/slots", holding a MapRecord; its
// version is the key's mod_revision and a write is etcd's compare-and-swap
// on it. So the map of a slotted run lives in etcd beside its shard
// groups' map ("<run prefix>/map", membership/map_store.h), and survives
// the loss of any shard.
//
// Example:
//
//   EtcdMapRecord record(etcd, RunPrefix(run_id));
//   absl::StatusOr<VersionedMapRecord> now = record.Read();

#include <string>

#include "membership/etcd_client.h"
#include "server/map_record_store.h"

namespace asyncps {

// Thread-safe (as EtcdClient).
class EtcdMapRecord final : public MapRecordStore {
 public:
  // `etcd` is not owned and outlives the record; `prefix` is the run's.
  EtcdMapRecord(EtcdClient* etcd, const std::string& prefix)
      : etcd_(etcd), key_(prefix + "/slots") {}

  // DATA_LOSS for a value that does not parse.
  absl::StatusOr<VersionedMapRecord> Read() override;
  absl::StatusOr<SwapMapRecordResponse> Swap(const MapRecord& record,
                                             uint64_t expected) override;
  std::string Where() const override { return "etcd key " + key_; }

  const std::string& key() const { return key_; }

 private:
  EtcdClient* const etcd_;
  const std::string key_;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_ETCD_MAP_RECORD_H_
