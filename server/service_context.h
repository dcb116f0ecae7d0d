#ifndef ASYNCPS_SERVER_SERVICE_CONTEXT_H_
#define ASYNCPS_SERVER_SERVICE_CONTEXT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/clock.h"
#include "common/shard_map_proto.h"
#include "proto/asyncps.pb.h"
#include "proto/replication.pb.h"
#include "server/checkpointer.h"
#include "server/push_gate.h"
#include "server/replication_log.h"
#include "server/shard_stats.h"
#include "server/slot_fence.h"
#include "server/spec_file.h"
#include "server/worker_registry.h"
#include "spdlog/spdlog.h"
#include "store/shard_store.h"
#include "store/staleness_rule.h"

namespace asyncps {

// What the service works on and reports about itself. Pointers are not
// owned and must outlive the service.
struct ServiceContext {
  int shard_index = 0;
  int num_shards = 1;
  std::string build_version;
  StalenessPolicy policy;
  StalenessRule rule;
  uint64_t max_parameter_bytes = 0;  // for Status
  // This process's epoch (see PullResponse.shard_epoch); nonzero.
  uint64_t epoch = 1;
  CheckpointInfo restored_from;  // empty when none
  ShardStore* store = nullptr;
  WorkerRegistry* workers = nullptr;
  ShardStats* stats = nullptr;
  PushGate* gate = nullptr;
  // Raised while this shard's slots move out (server/slot_mover.h): every
  // pull and push is refused UNAVAILABLE meanwhile. Null: never.
  SlotFence* fence = nullptr;
  Checkpointer* checkpointer = nullptr;  // null when checkpoints are off
  // Makes created tensors durable before CreateTensor answers; null when
  // checkpoints are off.
  SpecJournal* specs = nullptr;
  std::string run_id;  // the shard's run; heartbeats of other runs refused
  // The replica's log when the shard is replicated (ps_server --replicas),
  // else null: every state-changing step then runs through it.
  ReplicationLog* log = nullptr;
  // Adds the replica's place in its group to a Status answer; null when
  // not replicated.
  std::function<void(StatusResponse*)> replica_status;
  // Adds ReplicaStatus.state_digest (and the log index it is of); reads the
  // whole state.
  std::function<void(StatusResponse*)> state_digest;
  // StatusResponse.slot_move: the live slot move in progress ("" for none);
  // null when the shard has no mover.
  std::function<std::string()> slot_move;
  // StatusResponse.drained; null: never.
  std::function<bool()> drained;
  // Takes one step of a live slot move from the primary's log entry (a
  // backup; server/slot_mover.h); null when the shard has no mover.
  std::function<absl::Status(const MoveStep&)> apply_move;
  // Called when a request was routed with a newer map than the shard
  // serves (SlotMover::NewerMapRouted: the shard may be behind the run's
  // map); null: nothing to do.
  std::function<void()> newer_map_routed;
  Clock* clock = Clock::Real();
  std::shared_ptr<spdlog::logger> logger;
};

// Whether a request routed with map epoch `routed` is served now: not while
// the shard's slots are fenced (UNAVAILABLE: retry), and only by the map
// served now (CheckRouted: an older epoch is refused with the map, a newer
// one is UNAVAILABLE). The common case costs two atomic loads. A caller
// that reads or applies after this holds a push gate pass from before it,
// so that no map change (made with the gate closed) falls in between.
inline absl::Status CheckServing(const ServiceContext& c, uint64_t routed) {
  if (c.fence != nullptr && c.fence->fenced()) {
    if (c.stats != nullptr) c.stats->RecordMisrouted();
    return c.fence->Refusal();
  }
  if (routed == 0 || routed == c.store->map_epoch()) return absl::OkStatus();
  absl::Status s = CheckRouted(c.store->map(), routed);
  if (s.ok()) return s;
  if (c.stats != nullptr) c.stats->RecordMisrouted();
  if (absl::IsUnavailable(s) && c.newer_map_routed) c.newer_map_routed();
  return s;
}

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_SERVICE_CONTEXT_H_
