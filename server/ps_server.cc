#include "server/ps_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"
#include "common/net.h"
#include "common/version.h"
#include "server/checkpoint.h"

namespace asyncps {

StalenessPolicy PsServer::PolicyOf(const PsServerOptions& options) {
  StalenessPolicy p;
  p.set_consistency(options.consistency.consistency);
  p.set_ssp_slack(options.consistency.consistency == SSP
                      ? options.consistency.ssp_slack
                      : 0);
  p.set_max_staleness(options.staleness.max_staleness);
  p.set_staleness_lr(options.staleness.inverse_lr ? "inverse" : "none");
  p.set_worker_lease_ms(
      absl::ToInt64Milliseconds(options.consistency.worker_lease));
  p.set_pull_wait_timeout_ms(
      absl::ToInt64Milliseconds(options.consistency.pull_wait_timeout));
  return p;
}

absl::StatusOr<std::unique_ptr<PsServer>> PsServer::Start(
    PsServerOptions options) {
  if (options.logger == nullptr) {
    return absl::InvalidArgumentError("PsServerOptions.logger is required");
  }
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("port must be in [0, 65535], got ", options.port));
  }
  if (options.max_message_bytes < 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_message_bytes must be >= 1024, got ", options.max_message_bytes));
  }
  if (options.staleness.max_staleness < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_staleness must be >= 0, or -1 for unbounded; got ",
        options.staleness.max_staleness));
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      ServerCredentials(options.security);
  if (!credentials.ok()) return credentials.status();
  std::unique_ptr<PsServer> s(new PsServer());
  s->logger_ = options.logger;
  s->host_ = options.host;
  absl::StatusOr<std::unique_ptr<ShardStore>> store =
      ShardStore::Create(options.store);
  if (!store.ok()) return store.status();
  s->store_ = *std::move(store);
  CheckpointInfo restored;
  if (!options.checkpoint_dir.empty()) {
    const std::string path =
        CheckpointPath(options.checkpoint_dir, options.store.shard_index,
                       options.store.num_shards);
    if (options.restore) {
      absl::StatusOr<CheckpointInfo> r =
          RestoreCheckpoint(path, s->store_.get());
      if (r.ok()) {
        restored = *std::move(r);
        s->logger_->info(
            "restored checkpoint {} ({} bytes, {} tensors, {} slices, written "
            "{}) in {:.1f} ms",
            restored.path(), restored.bytes(), restored.tensors(),
            restored.slices(),
            absl::FormatTime(absl::FromUnixMillis(restored.unix_time_ms())),
            restored.duration_ms());
      } else if (absl::IsNotFound(r.status())) {
        s->logger_->info("no checkpoint at {}; starting empty", path);
      } else {
        return r.status();
      }
    } else {
      s->logger_->info("not restoring {} (restore off)", path);
    }
    CheckpointerOptions c;
    c.dir = options.checkpoint_dir;
    c.every = options.checkpoint_every;
    c.build_version = kVersion;
    c.logger = options.logger;
    absl::StatusOr<std::unique_ptr<Checkpointer>> checkpointer =
        Checkpointer::Start(s->store_.get(), std::move(c));
    if (!checkpointer.ok()) return checkpointer.status();
    s->checkpointer_ = *std::move(checkpointer);
  }
  options.consistency.logger = options.logger;
  absl::StatusOr<std::unique_ptr<WorkerTable>> workers =
      WorkerTable::Create(options.consistency);
  if (!workers.ok()) return workers.status();
  s->workers_ = *std::move(workers);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  const std::string listen = absl::StrCat(
      options.host.find(':') != std::string::npos ? "[" : "", options.host,
      options.host.find(':') != std::string::npos ? "]" : "", ":",
      options.port);
  builder.AddListeningPort(listen, *credentials, &s->port_);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  // A leftover server on the same port must not silently share it.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);

  ServiceIdentity identity;
  identity.shard_index = options.store.shard_index;
  identity.num_shards = options.store.num_shards;
  identity.build_version = kVersion;
  identity.policy = PolicyOf(options);
  s->service_ = std::make_unique<PsService>(
      identity, s->store_.get(), s->workers_.get(), &s->stats_,
      options.staleness, options.logger, s->checkpointer_.get(), restored);
  builder.RegisterService(s->service_.get());
  s->reflection_v1_ = std::make_unique<ReflectionV1Service>(
      std::vector<std::string>{kServiceName, "grpc.health.v1.Health",
                               "grpc.reflection.v1.ServerReflection",
                               "grpc.reflection.v1alpha.ServerReflection"});
  builder.RegisterService(s->reflection_v1_.get());
  if (options.rpc_metrics != nullptr) {
    std::vector<
        std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
        interceptors;
    interceptors.push_back(options.rpc_metrics->InterceptorFactory());
    builder.experimental().SetInterceptorCreators(std::move(interceptors));
  }
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    s->workers_->Shutdown();
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen,
                     " (address in use or not available?)"));
  }
  const bool v6 = options.host.find(':') != std::string::npos;
  const std::string bound = absl::StrCat(v6 ? "[" : "", options.host,
                                         v6 ? "]" : "", ":", s->port_);
  s->advertised_ = options.advertise_address.empty()
                       ? bound
                       : options.advertise_address;
  s->service_->set_address(s->advertised_);
  s->server_->GetHealthCheckService()->SetServingStatus(true);
  s->server_->GetHealthCheckService()->SetServingStatus(kServiceName, true);
  s->logger_->info(
      "shard {}/{} serving on {}{} (consistency {}, slack {}, max_staleness "
      "{}, staleness_lr {}, lease {} ms, {}{})",
      options.store.shard_index, options.store.num_shards, bound,
      s->advertised_ == bound ? ""
                              : absl::StrCat(", advertised as ", s->advertised_),
      Consistency_Name(identity.policy.consistency()),
      identity.policy.ssp_slack(), identity.policy.max_staleness(),
      identity.policy.staleness_lr(), identity.policy.worker_lease_ms(),
      options.security.tls_cert.empty()
          ? "plain TCP"
          : options.security.require_client_cert ? "mutual TLS" : "TLS",
      options.security.cluster_token.empty() ? "" : ", cluster token required");
  return s;
}

std::string PsServer::address() const {
  const bool any = host_.empty() || host_ == "0.0.0.0" || host_ == "::";
  return absl::StrCat(any ? "127.0.0.1" : host_, ":", port_);
}

absl::Status PsServer::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock l(&shutdown_mu_);
    if (shut_down_) return absl::OkStatus();
    shut_down_ = true;
  }
  logger_->info("shard shutting down");
  server_->GetHealthCheckService()->SetServingStatus(false);
  workers_->Shutdown();
  server_->Shutdown(std::chrono::system_clock::now() +
                    absl::ToChronoMilliseconds(grace));
  server_->Wait();
  absl::Status final_checkpoint;
  if (checkpointer_ != nullptr) {
    // Requested checkpoints were served while the calls drained; now no
    // update can arrive, so this one holds the final state.
    checkpointer_->Stop();
    final_checkpoint = checkpointer_->WriteNow().status();
  }
  logger_->info("shard stopped");
  return final_checkpoint;
}

PsServer::~PsServer() {
  if (server_ != nullptr) Shutdown(absl::Seconds(2)).IgnoreError();
}

StatusResponse PsServer::GetStatus() {
  StatusResponse r;
  service_->FillStatus(&r);
  return r;
}

}  // namespace asyncps
