#ifndef ASYNCPS_SERVER_PS_SERVER_H_
#define ASYNCPS_SERVER_PS_SERVER_H_

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/net.h"
#include "common/security.h"
#include "server/checkpointer.h"
#include "server/ps_service.h"
#include "server/reflection_v1.h"
#include "server/runtime_metrics.h"
#include "server/shard_stats.h"
#include "server/shard_store.h"
#include "server/worker_table.h"
#include "spdlog/spdlog.h"

namespace asyncps {

struct PsServerOptions {
  std::string host = "0.0.0.0";
  int port = 0;  // 0 = let the OS pick; see PsServer::port()
  // Larger requests are refused by gRPC with RESOURCE_EXHAUSTED.
  int max_message_bytes = kMaxMessageBytes;
  ShardStoreOptions store;
  StalenessRule staleness;
  ConsistencyOptions consistency;  // its logger is set from `logger`
  // Checkpoints (server/checkpoint.h); off when checkpoint_dir is empty.
  // Otherwise one is written on every Checkpoint RPC, every
  // checkpoint_every (0 = never periodically) and at Shutdown.
  std::string checkpoint_dir;
  absl::Duration checkpoint_every = absl::ZeroDuration();
  // Load this shard's checkpoint from checkpoint_dir before serving when
  // there is one; a checkpoint that cannot be restored fails Start.
  bool restore = true;
  // TLS / mutual TLS and the cluster token (common/security.h); default =
  // plain TCP, no token. Unreadable files fail Start.
  SecurityOptions security;
  // host:port reported in Status and logs (e.g. the name clients dial);
  // empty = the address actually bound, e.g. "0.0.0.0:7000".
  std::string advertise_address;
  // Not owned; when set, every call is counted and timed into it (a server
  // interceptor). Must outlive the PsServer.
  RpcMetrics* rpc_metrics = nullptr;
  std::shared_ptr<spdlog::logger> logger;  // required
};

// One running shard: the store, the worker table, and a gRPC server with the
// ParameterServer service, the standard health service and reflection.
// Several PsServers can live in one process (tests).
//
// Thread-safe.
class PsServer {
 public:
  // Validates options, restores the checkpoint (if any), binds and starts
  // serving. Only a failed restore returns DATA_LOSS (corrupt checkpoint)
  // or FAILED_PRECONDITION (another shard's); see RestoreCheckpoint.
  static absl::StatusOr<std::unique_ptr<PsServer>> Start(PsServerOptions options);
  ~PsServer();  // Shutdown() with a short grace period

  int port() const { return port_; }
  // host:port as a client on this machine would dial it.
  std::string address() const;
  // host:port as reported in Status and logs (advertise_address, or the
  // bound address).
  const std::string& advertised_address() const { return advertised_; }

  // The gRPC service name the health service also reports for.
  static constexpr char kServiceName[] = "asyncps.ParameterServer";

  // Refuses new calls, fails waiting pulls with UNAVAILABLE, lets in-flight
  // calls finish within `grace`, then cancels the rest; then, with
  // checkpoints on, writes a final checkpoint. Returns that checkpoint's
  // error, if any. Idempotent (later calls return OK).
  absl::Status Shutdown(absl::Duration grace = absl::Seconds(5));

  // The Status RPC's answer (also for the metrics endpoint).
  StatusResponse GetStatus();

  // The policy as reported in Status.
  static StalenessPolicy PolicyOf(const PsServerOptions& options);

 private:
  PsServer() = default;

  std::shared_ptr<spdlog::logger> logger_;
  std::unique_ptr<ShardStore> store_;
  std::unique_ptr<WorkerTable> workers_;
  ShardStats stats_;
  std::unique_ptr<Checkpointer> checkpointer_;  // null when off
  std::unique_ptr<PsService> service_;
  std::unique_ptr<ReflectionV1Service> reflection_v1_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string host_;
  std::string advertised_;
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_PS_SERVER_H_
