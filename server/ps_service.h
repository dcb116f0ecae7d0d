#ifndef ASYNCPS_SERVER_PS_SERVICE_H_
#define ASYNCPS_SERVER_PS_SERVICE_H_

#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/asyncps.grpc.pb.h"
#include "server/push_dedup.h"
#include "server/shard_stats.h"
#include "server/shard_store.h"
#include "server/worker_table.h"
#include "spdlog/spdlog.h"

namespace asyncps {

// What the service reports about itself in Status.
struct ServiceIdentity {
  int shard_index = 0;
  int num_shards = 1;
  std::string build_version;
  StalenessPolicy policy;
};

// The ParameterServer gRPC service of one shard, on gRPC's callback API.
// Handlers validate input, then work on the store; a pull that must wait for
// slower workers registers a callback with the WorkerTable and returns, so no
// gRPC thread is held while it waits. absl::Status becomes grpc::Status here
// and nowhere else on the server.
//
// Thread-safe. The store, table and stats are not owned and must outlive it.
class PsService final : public ParameterServer::CallbackService {
 public:
  PsService(ServiceIdentity identity, ShardStore* store, WorkerTable* workers,
            ShardStats* stats, StalenessRule rule,
            std::shared_ptr<spdlog::logger> logger);

  grpc::ServerUnaryReactor* CreateTensor(
      grpc::CallbackServerContext* ctx, const CreateTensorRequest* request,
      CreateTensorResponse* response) override;
  grpc::ServerUnaryReactor* ListTensors(grpc::CallbackServerContext* ctx,
                                        const ListTensorsRequest* request,
                                        ListTensorsResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const HeartbeatRequest* request,
                                      HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* ctx,
                                 const PullRequest* request,
                                 PullResponse* response) override;
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* ctx,
                                 const PushRequest* request,
                                 PushResponse* response) override;
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx,
                                   const StatusRequest* request,
                                   StatusResponse* response) override;

  // The Status RPC's answer, also used by the metrics endpoint.
  void FillStatus(StatusResponse* response);

  // The address is known only once the server has bound its port.
  void set_address(const std::string& address) {
    absl::MutexLock l(&mu_);
    address_ = address;
  }

 private:
  const ServiceIdentity identity_;
  ShardStore* const store_;
  WorkerTable* const workers_;
  ShardStats* const stats_;
  const StalenessRule rule_;
  const std::shared_ptr<spdlog::logger> logger_;
  const absl::Time start_time_;
  PushDedup dedup_;
  absl::Mutex mu_;
  std::string address_ ABSL_GUARDED_BY(mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_PS_SERVICE_H_
