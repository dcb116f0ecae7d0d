#ifndef ASYNCPS_SERVER_PS_SERVER_H_
#define ASYNCPS_SERVER_PS_SERVER_H_

// A whole parameter-server shard in one object: PsServer::Start builds the
// store and the worker registry from PsServerOptions, restores the shard's
// checkpoint when there is one, and serves the ParameterServer gRPC service
// until Shutdown. server_main.cc fills the options from flags; tests start
// several shards in one process, each on a port the OS picks.
//
// Example:
//
//   PsServerOptions options;
//   options.host = "127.0.0.1";
//   options.port = 0;  // any free port; port() says which
//   options.store.shard_index = 0;
//   options.store.num_shards = 2;
//   options.workers.consistency = SSP;
//   options.workers.ssp_slack = 2;
//   options.checkpoint_dir = dir;  // restored from, written to
//   options.checkpoint_every = absl::Minutes(5);
//   options.logger = logger;  // required
//   absl::StatusOr<std::unique_ptr<PsServer>> shard =
//       PsServer::Start(std::move(options));
//   if (!shard.ok()) return shard.status();
//   const std::string address = (*shard)->address();  // for the workers
//   ...
//   absl::Status last = (*shard)->Shutdown();  // and a final checkpoint

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/executor.h"
#include "common/net.h"
#include "common/security.h"
#include "common/steady_wait.h"
#include "server/checkpointer.h"
#include "server/file_system.h"
#include "server/ps_service.h"
#include "server/push_gate.h"
#include "server/reflection.h"
#include "server/replica_feed.h"
#include "server/replication_log.h"
#include "server/runtime_metrics.h"
#include "server/shard_stats.h"
#include "server/slot_fence.h"
#include "server/slot_mover.h"
#include "server/slot_moves_service.h"
#include "server/spec_file.h"
#include "server/worker_registry.h"
#include "spdlog/spdlog.h"
#include "store/shard_store.h"

namespace asyncps {

struct PsServerOptions {
  std::string host = "0.0.0.0";
  int port = 0;  // 0 = let the OS pick; see PsServer::port()
  // Larger requests are refused by gRPC with RESOURCE_EXHAUSTED.
  int max_message_bytes = kMaxMessageBytes;
  ShardStoreOptions store;  // includes max_parameter_bytes
  // The run's shard map when it is created (server/starting_map.h): 0 =
  // the static map of store.num_shards, S = S slots spread evenly. A shard
  // that restores files serves their map instead (store.map is set from
  // them at Start).
  int num_slots = 0;
  // With num_slots: 0 = the slots start spread over every shard; K = over
  // shards 0..K-1 only, the others standing by with no slot (psctl scale
  // moves slots to them). Ignored when the files' map is restored.
  int serving_shards = 0;
  StalenessRule staleness;
  // Its logger and executor are set here; its clock stays its own
  // (monotonic), not `clock` below.
  RegistryOptions workers;
  // Checkpoints (server/checkpoint.h); off when checkpoint_dir is empty.
  // Otherwise one is written on every Checkpoint RPC, every
  // checkpoint_every (0 = never periodically) and at Shutdown.
  std::string checkpoint_dir;
  absl::Duration checkpoint_every = absl::ZeroDuration();
  // Incremental checkpoints (server/checkpoint_delta.h): every
  // checkpoint_full_every-th checkpoint is full, those between are deltas
  // of what changed since the previous one (0 or 1 = always full); also
  // full once the deltas reach checkpoint_delta_max_fraction of the full
  // checkpoint's size.
  int checkpoint_full_every = 1;
  double checkpoint_delta_max_fraction = 0.5;
  // Load this shard's checkpoint (and spec file) from checkpoint_dir before
  // serving when there is one; one that cannot be restored fails Start.
  bool restore = true;
  // The run this shard belongs to: stored in its checkpoints and spec file,
  // reported in Status, and required of workers' heartbeats.
  std::string run_id;
  // Restore the files of this other run (kAdoptAnyRun: of any run) as this
  // run's start: parameters, optimizer state and versions are kept, the
  // other run's worker records are dropped. "" = only this run's files.
  std::string adopt_run;
  // TLS / mutual TLS and the cluster token (common/security.h); default =
  // plain TCP, no token. Unreadable files fail Start.
  SecurityOptions security;
  // Wall time: checkpoint times, uptime (not owned).
  Clock* clock = Clock::Real();
  // Every file of checkpoint_dir is read (restore) and written (checkpoints,
  // spec file) through it. Not owned; never null.
  FileSystem* fs = FileSystem::Default();
  // host:port reported in Status and logs (e.g. the name clients dial);
  // empty = the address actually bound, e.g. "0.0.0.0:7000".
  std::string advertise_address;
  // Not owned; when set, every call is counted and timed into it (a server
  // interceptor). Must outlive the PsServer.
  RpcMetrics* rpc_metrics = nullptr;
  std::shared_ptr<spdlog::logger> logger;  // required
  // A replica of a shard group (ps_server --replicas): every
  // state-changing step runs through this log, and the server also serves
  // the Follow stream to backups. Not owned; null = not replicated.
  ReplicationLog* log = nullptr;
  // The shard epoch to serve with (a backup's is its primary's); 0 = draw
  // one.
  uint64_t epoch = 0;
  // Adds the replica's place in its group to Status answers (with `log`).
  std::function<void(StatusResponse*)> replica_status;
  // Which replicas the Follow stream serves (ReplicaFeedOptions::admits).
  std::function<bool(const std::string& id)> replica_admits;
  // The current primary of another shard's group (with `log`): where a
  // fenced source asks how a move ended (SlotMoverOptions::primary_of).
  std::function<absl::StatusOr<std::string>(int shard)> primary_of;
  // Live moves out: the copy rounds before the fence send at most this
  // many MB/s (SlotMoverOptions::copy_mb_s); 0 = unlimited.
  double move_copy_mb_s = 0;
  // A run with etcd: where its map record lives
  // (SlotMoverOptions::run_map_record); null = at the keeper moves name.
  std::shared_ptr<MapRecordStore> run_map_record;
};

// One running shard: the store, the worker registry, and a gRPC server with
// the ParameterServer service, the standard health service and reflection.
// Several PsServers can live in one process (tests).
//
// Thread-safe.
class PsServer {
 public:
  // Validates options, checks the checkpoint directory (CheckCheckpointDir:
  // FAILED_PRECONDITION for files of another shard count or run), restores
  // the checkpoint and then the spec file (if any), binds and starts
  // serving. A failed restore returns DATA_LOSS (corrupt file),
  // FAILED_PRECONDITION (another shard's), RESOURCE_EXHAUSTED (larger than
  // max_parameter_bytes) or the error of listing or reading a file through
  // options.fs (naming it); see RestoreCheckpoint.
  static absl::StatusOr<std::unique_ptr<PsServer>> Start(
      PsServerOptions options);
  ~PsServer();  // Shutdown()

  int port() const { return port_; }
  // host:port as a client on this machine would dial it.
  std::string address() const;
  uint64_t epoch() const { return epoch_; }

  // The gRPC service name the health service also reports for.
  static constexpr char kServiceName[] = "asyncps.ParameterServer";

  // Before Shutdown at a stop signal: a shard that psctl scale drained
  // (SlotMover::drained) keeps answering until no pull or push reached it
  // for `quiet` (at most `most`): clients still routing by the older map
  // learn the new one from it, and a push part they sent here is answered
  // (a duplicate, or refused with the map) instead of retried at a stopped
  // process until the call's deadline. Returns at once otherwise.
  void LingerIfDrained(absl::Duration quiet, absl::Duration most);

  // Refuses new calls, fails waiting pulls with UNAVAILABLE, ends the data
  // streams once their requests in progress are answered, lets other
  // in-flight calls finish within `grace`, then cancels the rest; then,
  // with checkpoints on, writes a final checkpoint. Returns that
  // checkpoint's error, if any. Idempotent (later calls return OK).
  absl::Status Shutdown(absl::Duration grace = absl::Seconds(2));

  // The Status RPC's answer (also for the metrics endpoint).
  StatusResponse GetStatus();

  // The service (a backup's follower applies its entries through it).
  PsService* service() { return service_.get(); }

  // The policy as reported in Status.
  static StalenessPolicy PolicyOf(const PsServerOptions& options);

 private:
  PsServer() = default;

  // The steps of Start, in order. INVALID_ARGUMENT for options a shard
  // cannot start with.
  static absl::Status ValidateOptions(const PsServerOptions& options);
  // Draws the epoch; creates the store, the executor and the worker
  // registry (whose logger and executor it sets in *options).
  absl::Status CreateState(PsServerOptions* options);
  // With checkpoints on: checks the directory, restores (Restore), makes
  // the spec file durable and starts the checkpointer (which writes at once
  // after an adopted run's restore). Returns what was restored (empty when
  // nothing was, or checkpoints are off).
  absl::StatusOr<CheckpointInfo> StartCheckpoints(
      const PsServerOptions& options);
  // The service's view of this shard; `restored` is what Status reports
  // as restored_from.
  ServiceContext MakeServiceContext(const PsServerOptions& options,
                                    const CheckpointInfo& restored);
  // Builds and starts the gRPC server (the ParameterServer service, health,
  // reflection) on options.host:options.port and marks it serving;
  // UNAVAILABLE (and the registry shut down) when it cannot listen.
  absl::Status Serve(
      const PsServerOptions& options,
      const std::shared_ptr<grpc::ServerCredentials>& credentials,
      const CheckpointInfo& restored);
  // Starts the thread that samples the statistics and evicts idle rows
  // every second (StopSampler ends it).
  void StartSampler();
  // Logs where the shard serves and the policy it serves with.
  void LogServing(const PsServerOptions& options) const;

  // Restores the checkpoint of options.checkpoint_dir (adopting another
  // run's: parameters only), then the spec file; returns what was restored
  // (empty when nothing).
  absl::StatusOr<CheckpointInfo> Restore(const PsServerOptions& options);
  // Reads this shard's checkpoint at `path` and the deltas of its chain
  // into the store, logging what it applied and ignored.
  absl::StatusOr<RestoredCheckpoint> ReadCheckpoint(
      const PsServerOptions& options, const std::string& path);
  // Holds pushes back and serializes the state (the checkpointer's
  // captures): all of it, or with `chain` a delta of what changed at or
  // after ChangeEpoch `since`.
  CheckpointImage Capture(const DeltaChain* chain, uint32_t since);
  // A checkpoint file of the state at a cut of the replication log, for a
  // backup that needs a snapshot.
  absl::StatusOr<FeedSnapshot> Snapshot();
  // Sets ReplicaStatus.state_digest and the log index it is of.
  void FillDigest(StatusResponse* response);
  // Evicts sparse rows unused for --row_ttl_steps steps of the fastest live
  // worker, and rows of tables that evict under the cap when little room is
  // left (the sampler thread calls this every second).
  void EvictIdleRows();
  void StopSampler();

  std::shared_ptr<spdlog::logger> logger_;
  Clock* clock_ = nullptr;
  uint64_t epoch_ = 0;
  std::unique_ptr<ShardStore> store_;
  // Runs the copy-out of pulls released by other calls.
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<WorkerRegistry> workers_;
  ShardStats stats_;
  PushGate gate_;
  std::unique_ptr<Checkpointer> checkpointer_;  // null when off
  std::unique_ptr<SpecJournal> specs_;          // null when off
  std::string run_id_;
  bool adopted_ = false;  // restored another run's checkpoint (--adopt_run)
  // The spec file as the restore read it (none: there was none).
  std::optional<SpecFileContents> restored_specs_;
  std::unique_ptr<PsService> service_;
  ReplicationLog* log_ = nullptr;
  std::unique_ptr<ReplicaFeedService> feed_;  // null unless replicated
  SlotFence fence_;  // raised while slots leave this shard
  std::unique_ptr<SlotMover> mover_;
  std::unique_ptr<SlotMovesService> slot_moves_;
  std::unique_ptr<ReflectionAnswers> reflection_;
  std::unique_ptr<ReflectionV1Service> reflection_v1_;
  std::unique_ptr<ReflectionV1AlphaService> reflection_v1alpha_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string host_;
  // Samples the statistics once per second for the rates.
  SteadyNotification stop_sampler_;  // its 1 s on the monotonic clock
  std::thread sampler_;
  std::string advertised_;
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_PS_SERVER_H_
