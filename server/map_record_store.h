#ifndef ASYNCPS_SERVER_MAP_RECORD_STORE_H_
#define ASYNCPS_SERVER_MAP_RECORD_STORE_H_

// Where a slotted run's map record lives (proto/slot_moves.proto
// MapRecord: the map of the last committed move and the move that holds
// the next epoch), read and compare-and-swapped by version, so that
// server/map_keeper.h lets one map change at a time take an epoch:
//
//   - in etcd, for a run with --etcd_endpoints (server/etcd_map_record.h);
//   - in the memory of the shard psctl names as the run's keeper (shard 0),
//     which serves it to the others (SlotMoves.ReadMapRecord and
//     SwapMapRecord): LocalMapRecord there, RemoteMapRecord at the callers.
//
// Example (a destination before it copies anything):
//
//   RemoteMapRecord keeper(request.keeper(), run_id, security);
//   absl::StatusOr<VersionedMapRecord> now = keeper.Read();
//   ... change a copy of now->record() ...
//   absl::StatusOr<VersionedMapRecord> after =
//       keeper.Swap(changed, now->version());
//   // after->version() != now->version() + ... : someone wrote between

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/security.h"
#include "proto/slot_moves.grpc.pb.h"
#include "server/file_system.h"

namespace asyncps {

class MapRecordStore {
 public:
  virtual ~MapRecordStore() = default;

  // The record and its version (0, empty: never written).
  virtual absl::StatusOr<VersionedMapRecord> Read() = 0;

  // Writes `record` only if the record is still at version `expected`.
  // The answer says whether it was and holds the record now.
  virtual absl::StatusOr<SwapMapRecordResponse> Swap(const MapRecord& record,
                                                     uint64_t expected) = 0;

  // Where the record lives, for messages ("shard 0 at 10.0.0.1:7000").
  virtual std::string Where() const = 0;
};

// The keeper shard's record: in this process's memory and, with `path`
// (the shard's checkpoint directory, "shard-<i>-of-<n>.maprecord"), in a
// record file written atomically (server/record_file.h) before each write
// is answered, so that a keeper restarted on its files (kill -9, a node
// lost) still knows which move holds the next epoch. Without a path it is
// lost when the process restarts. A file that cannot be read (not a
// missing one) refuses every read and write, naming it: delete it to
// start afresh. Thread-safe.
class LocalMapRecord final : public MapRecordStore {
 public:
  // Loads `path` when given (through `fs`, null = the default).
  LocalMapRecord(std::string where, std::string path = "",
                 FileSystem* fs = nullptr);

  absl::StatusOr<VersionedMapRecord> Read() override ABSL_LOCKS_EXCLUDED(mu_);
  // Also UNAVAILABLE (nothing changed) when the file cannot be written.
  absl::StatusOr<SwapMapRecordResponse> Swap(const MapRecord& record,
                                             uint64_t expected) override
      ABSL_LOCKS_EXCLUDED(mu_);
  std::string Where() const override { return where_; }

 private:
  const std::string where_;
  const std::string path_;
  FileSystem* const fs_;
  absl::Mutex mu_;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);  // the file did not load
  VersionedMapRecord record_ ABSL_GUARDED_BY(mu_);
};

// The record of the keeper shard at `address`, through its SlotMoves
// service. Errors say the keeper does not answer (UNAVAILABLE) or belongs
// to another run (FAILED_PRECONDITION).
class RemoteMapRecord final : public MapRecordStore {
 public:
  RemoteMapRecord(std::string address, std::string run_id,
                  const SecurityOptions& security,
                  absl::Duration timeout = absl::Seconds(5));

  absl::StatusOr<VersionedMapRecord> Read() override;
  absl::StatusOr<SwapMapRecordResponse> Swap(const MapRecord& record,
                                             uint64_t expected) override;
  std::string Where() const override;

 private:
  const std::string address_;
  const std::string run_id_;
  const absl::Duration timeout_;
  std::unique_ptr<SlotMoves::Stub> stub_;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_MAP_RECORD_STORE_H_
