#include "server/ps_server.h"

#include <grpcpp/health_check_service_interface.h>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/net.h"
#include "common/parse_refusal.h"
#include "common/version.h"
#include "server/checkpoint.h"
#include "server/checkpoint_dir.h"
#include "server/memory_file_system.h"
#include "server/record_file.h"
#include "server/starting_map.h"
#include "server/state_digest.h"

namespace asyncps {

StalenessPolicy PsServer::PolicyOf(const PsServerOptions& options) {
  StalenessPolicy p;
  p.set_consistency(options.workers.consistency);
  p.set_ssp_slack(options.workers.consistency == SSP ? options.workers.ssp_slack
                                                     : 0);
  p.set_max_staleness(options.staleness.max_staleness);
  p.set_staleness_lr(options.staleness.inverse_lr ? "inverse" : "none");
  p.set_worker_lease_ms(
      absl::ToInt64Milliseconds(options.workers.worker_lease));
  p.set_pull_wait_timeout_ms(
      absl::ToInt64Milliseconds(options.workers.pull_wait_timeout));
  return p;
}

namespace {

// "host:port", with an IPv6 host in brackets.
std::string JoinHostPort(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos;
  return absl::StrCat(v6 ? "[" : "", host, v6 ? "]" : "", ":", port);
}

// Message sizes, keepalive and flow control of the shard's connections.
void SetTransportArguments(const PsServerOptions& options,
                           grpc::ServerBuilder* builder) {
  builder->SetMaxReceiveMessageSize(options.max_message_bytes);
  builder->SetMaxSendMessageSize(kMaxMessageBytes);
  // A leftover server on the same port must not silently share it.
  builder->AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Clients ping idle connections every few seconds (common/net.h) so that
  // both sides notice a dead peer in seconds; allow it, and ping back.
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder->AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  // A connection that has not finished its handshake (TLS, HTTP/2
  // settings) within this goes; gRPC's default of 120 s let silent
  // connections hold their descriptors that long.
  builder->AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 10000);
  // A stream's flow-control window opens as the shard reads it, up to the
  // lookahead. gRPC's BDP probe also grows the window of new streams with
  // the connection's measured bandwidth, before the shard has read
  // anything: with the probe a large push goes out without waiting for
  // window updates (push_pull_bench, 1 shard + 1 client, 256 KiB pushes:
  // 1.14-1.58x the MB/s without it, shard CPU per GB lower in proportion;
  // 16 B - 16 KiB and pulls unchanged within noise). With a cluster token
  // the probe stays off: the shard reads only calls that passed the token
  // check, and with the probe a caller without the token could make it
  // buffer megabytes per stream before the refusal (measured: 16
  // connections of 8 MiB requests without the token, RSS 20 -> 243 MiB
  // over 10 rounds with the probe, flat at 23 MiB without;
  // tests/integration/request_isolation_test.cc). Without a token every
  // caller may send whole messages anyway, so the probe exposes nothing.
  builder->AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 16 << 20);
  if (!options.security.cluster_token.empty()) {
    builder->AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  }
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 16 << 20);
}

}  // namespace

absl::StatusOr<std::unique_ptr<PsServer>> PsServer::Start(
    PsServerOptions options) {
  absl::Status s = ValidateOptions(options);
  if (!s.ok()) return s;
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      ServerCredentials(options.security);
  if (!credentials.ok()) return credentials.status();
  std::unique_ptr<PsServer> server(new PsServer());
  s = server->CreateState(&options);
  if (!s.ok()) return s;
  absl::StatusOr<CheckpointInfo> restored = server->StartCheckpoints(options);
  if (!restored.ok()) return restored.status();
  s = server->Serve(options, *credentials, *restored);
  if (!s.ok()) return s;
  server->StartSampler();
  server->LogServing(options);
  return server;
}

absl::Status PsServer::ValidateOptions(const PsServerOptions& options) {
  if (options.logger == nullptr || options.clock == nullptr ||
      options.fs == nullptr) {
    return absl::InvalidArgumentError(
        "PsServerOptions.logger, clock and fs are required");
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
    return absl::InvalidArgumentError(
        absl::StrCat("max_staleness must be >= 0, or -1 for unbounded; got ",
                     options.staleness.max_staleness));
  }
  return absl::OkStatus();
}

absl::Status PsServer::CreateState(PsServerOptions* options) {
  logger_ = options->logger;
  clock_ = options->clock;
  host_ = options->host;
  run_id_ = options->run_id;
  log_ = options->log;
  epoch_ = options->epoch;
  if (epoch_ == 0) {
    absl::BitGen bits;
    do {
      epoch_ = absl::Uniform<uint64_t>(bits);
    } while (epoch_ == 0);
  }
  // The directory first (files of another shard count or run are named as
  // such), then the map its files were written under.
  if (!options->checkpoint_dir.empty()) {
    absl::Status checked =
        CheckCheckpointDir({options->checkpoint_dir, options->store.shard_index,
                            options->store.num_shards, options->run_id,
                            options->adopt_run, options->restore, options->fs});
    if (!checked.ok()) return checked;
  }
  absl::StatusOr<ShardMap> map = StartingShardMap(
      {options->checkpoint_dir, options->restore, options->store.shard_index,
       options->store.num_shards, options->num_slots, options->fs,
       options->serving_shards});
  if (!map.ok()) return map.status();
  options->store.map = *map;
  // Incremental checkpoints record evicted rows.
  options->store.track_removed_rows =
      !options->checkpoint_dir.empty() && options->checkpoint_full_every > 1;
  absl::StatusOr<std::unique_ptr<ShardStore>> store =
      ShardStore::Create(options->store);
  if (!store.ok()) return store.status();
  store_ = *std::move(store);

  executor_ = std::make_unique<Executor>(1);
  options->workers.logger = options->logger;
  options->workers.shard_index =
      static_cast<uint32_t>(options->store.shard_index);
  options->workers.executor = executor_.get();
  absl::StatusOr<std::unique_ptr<WorkerRegistry>> workers =
      WorkerRegistry::Create(options->workers);
  if (!workers.ok()) return workers.status();
  workers_ = *std::move(workers);
  return absl::OkStatus();
}

absl::StatusOr<CheckpointInfo> PsServer::StartCheckpoints(
    const PsServerOptions& options) {
  if (options.checkpoint_dir.empty()) return CheckpointInfo();
  absl::StatusOr<CheckpointInfo> restored = Restore(options);
  if (!restored.ok()) return restored.status();
  CheckpointIdentity identity;
  identity.set_shard_index(options.store.shard_index);
  identity.set_num_shards(options.store.num_shards);
  identity.set_build_version(kVersion);
  identity.set_run_id(options.run_id);
  SetIdentityMap(store_->map(), &identity);
  specs_ = std::make_unique<SpecJournal>(
      SpecFilePath(options.checkpoint_dir, options.store.shard_index,
                   options.store.num_shards),
      identity, store_.get(), options.fs);
  // What the checkpoint held is durable already; this writes the spec
  // file where there is none yet (or one of an adopted run). A write that
  // fails (a full disk) does not keep a restored shard from serving: the
  // checkpoint and the spec file it read hold every spec it has, and the
  // next CreateTensor writes the file again (and fails while it cannot).
  if (restored_specs_.has_value()) specs_->Known(*std::move(restored_specs_));
  absl::Status synced = specs_->Sync();
  if (!synced.ok()) {
    logger_->warn(
        "{}; serving what was restored (tensors and tables created from now "
        "on are refused until the file can be written)",
        synced.ToString());
  }
  CheckpointerOptions c;
  c.dir = options.checkpoint_dir;
  c.every = options.checkpoint_every;
  c.clock = options.clock;
  c.fs = options.fs;
  c.logger = options.logger;
  c.capture = [this] { return Capture(nullptr, 0); };
  c.full_every = options.checkpoint_full_every;
  c.delta_max_fraction = options.checkpoint_delta_max_fraction;
  c.capture_delta = [this](uint32_t since, const DeltaChain& chain) {
    return Capture(&chain, since);
  };
  absl::StatusOr<std::unique_ptr<Checkpointer>> checkpointer =
      Checkpointer::Start(std::move(c));
  if (!checkpointer.ok()) return checkpointer.status();
  checkpointer_ = *std::move(checkpointer);
  if (adopted_) {
    // The directory holds this run's state from now on: a restart without
    // --adopt_run restores it as this run's.
    absl::StatusOr<CheckpointInfo> written = checkpointer_->WriteNow();
    if (!written.ok()) return written.status();
  }
  return restored;
}

ServiceContext PsServer::MakeServiceContext(const PsServerOptions& options,
                                            const CheckpointInfo& restored) {
  ServiceContext context;
  context.shard_index = options.store.shard_index;
  context.num_shards = options.store.num_shards;
  context.build_version = kVersion;
  context.policy = PolicyOf(options);
  context.rule = options.staleness;
  context.max_parameter_bytes = options.store.max_parameter_bytes;
  context.epoch = epoch_;
  context.restored_from = restored;
  context.store = store_.get();
  context.workers = workers_.get();
  context.stats = &stats_;
  context.gate = &gate_;
  context.fence = &fence_;
  context.checkpointer = checkpointer_.get();
  context.specs = specs_.get();
  context.run_id = options.run_id;
  context.clock = options.clock;
  context.logger = options.logger;
  context.log = options.log;
  context.replica_status = options.replica_status;
  context.state_digest = [this](StatusResponse* r) { FillDigest(r); };
  // The mover starts with the server (after the context): none before.
  context.slot_move = [this] {
    return mover_ != nullptr ? mover_->Describe() : std::string();
  };
  context.drained = [this] { return mover_ != nullptr && mover_->drained(); };
  // A backup takes its primary's move steps (entries come once serving).
  context.apply_move = [this](const MoveStep& step) {
    return mover_ != nullptr ? mover_->ApplyStep(step)
                             : absl::UnavailableError("no slot mover yet");
  };
  context.newer_map_routed = [this] {
    if (mover_ != nullptr) mover_->NewerMapRouted();
  };
  return context;
}

absl::Status PsServer::Serve(
    const PsServerOptions& options,
    const std::shared_ptr<grpc::ServerCredentials>& credentials,
    const CheckpointInfo& restored) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  const std::string listen = JoinHostPort(options.host, options.port);
  builder.AddListeningPort(listen, credentials, &port_);
  SetTransportArguments(options, &builder);
  service_ = std::make_unique<PsService>(MakeServiceContext(options, restored));
  builder.RegisterService(service_.get());
  if (log_ != nullptr) {
    ReplicaFeedOptions f;
    f.run_id = options.run_id;
    f.shard_index = options.store.shard_index;
    f.num_shards = options.store.num_shards;
    f.log = log_;
    f.snapshot = [this] { return Snapshot(); };
    f.admits = options.replica_admits;
    f.logger = options.logger;
    feed_ = std::make_unique<ReplicaFeedService>(std::move(f));
    builder.RegisterService(feed_.get());
  }
  SlotMoverOptions moves;
  moves.security = PeerSecurity(options.security);
  moves.primary_of = options.primary_of;
  moves.run_map_record = options.run_map_record;
  moves.copy_mb_s = options.move_copy_mb_s;
  if (!options.checkpoint_dir.empty()) {
    moves.map_record_path =
        ShardFilePath(options.checkpoint_dir, options.store.shard_index,
                      options.store.num_shards, "maprecord");
  }
  moves.fs = options.fs;
  mover_ = std::make_unique<SlotMover>(&service_->context(), &fence_,
                                       std::move(moves));
  slot_moves_ = std::make_unique<SlotMovesService>(mover_.get());
  builder.RegisterService(slot_moves_.get());
  reflection_ = std::make_unique<ReflectionAnswers>(std::vector<std::string>{
      kServiceName, "asyncps.SlotMoves", "grpc.health.v1.Health",
      "grpc.reflection.v1.ServerReflection",
      "grpc.reflection.v1alpha.ServerReflection"});
  reflection_v1_ = std::make_unique<ReflectionV1Service>(reflection_.get());
  reflection_v1alpha_ =
      std::make_unique<ReflectionV1AlphaService>(reflection_.get());
  builder.RegisterService(reflection_v1_.get());
  builder.RegisterService(reflection_v1alpha_.get());
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  if (options.rpc_metrics != nullptr) {
    interceptors.push_back(options.rpc_metrics->InterceptorFactory());
  }
  // The ParameterServer and SlotMoves services parse their own requests.
  interceptors.push_back(ParseRefusalFactory(
      {absl::StrCat("/", kServiceName, "/"), "/asyncps.SlotMoves/"}));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) {
    workers_->Shutdown();
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", listen, " (address in use or not available?)"));
  }
  const std::string bound = JoinHostPort(options.host, port_);
  advertised_ =
      options.advertise_address.empty() ? bound : options.advertise_address;
  service_->set_address(advertised_);
  server_->GetHealthCheckService()->SetServingStatus(true);
  server_->GetHealthCheckService()->SetServingStatus(kServiceName, true);
  // Files older than the run's map in etcd: catch up before a client asks.
  mover_->NewerMapRouted();
  return absl::OkStatus();
}

void PsServer::StartSampler() {
  sampler_ = std::thread([this] {
    do {
      stats_.Sample(clock_->Now());
      EvictIdleRows();
    } while (!stop_sampler_.WaitForNotificationWithTimeout(absl::Seconds(1)));
  });
}

void PsServer::LogServing(const PsServerOptions& options) const {
  const StalenessPolicy policy = PolicyOf(options);
  const std::string bound = JoinHostPort(options.host, port_);
  logger_->info(
      "shard {}/{} serving on {}{} (consistency {}, slack {}, max_staleness "
      "{}, staleness_lr {}, lease {} ms, max_parameter_bytes {}, row_ttl_steps "
      "{}, {}{})",
      options.store.shard_index, options.store.num_shards, bound,
      advertised_ == bound ? "" : absl::StrCat(", advertised as ", advertised_),
      Consistency_Name(policy.consistency()), policy.ssp_slack(),
      policy.max_staleness(), policy.staleness_lr(), policy.worker_lease_ms(),
      options.store.max_parameter_bytes, options.store.row_ttl_steps,
      options.security.tls_cert.empty()      ? "plain TCP"
      : options.security.require_client_cert ? "mutual TLS"
                                             : "TLS",
      options.security.cluster_token.empty() ? "" : ", cluster token required");
}

absl::StatusOr<RestoredCheckpoint> PsServer::ReadCheckpoint(
    const PsServerOptions& options, const std::string& path) {
  const absl::StatusOr<FileStat> stat = options.fs->Stat(path);
  const uint64_t size = stat.ok() ? stat->size : 0;
  RestoreCheckpointOptions restore;
  restore.fs = options.fs;
  if (stat.ok()) {
    logger_->info("restoring checkpoint {} ({} bytes)", path, size);
    // The deltas of its chain (server/checkpoint_delta.h).
    absl::StatusOr<std::vector<std::string>> deltas =
        ListDeltaFiles(options.checkpoint_dir, options.store.shard_index,
                       options.store.num_shards, options.fs);
    if (!deltas.ok()) return deltas.status();
    restore.deltas = *std::move(deltas);
  }
  restore.progress = [this, &path, size](uint64_t read) {
    logger_->info("restoring {}: {} of {} bytes read ({:.0f}%)", path, read,
                  size, size > 0 ? 100.0 * read / size : 100.0);
  };
  absl::StatusOr<RestoredCheckpoint> r =
      RestoreCheckpoint(path, store_.get(), restore);
  if (!r.ok() || restore.deltas.empty()) return r;
  logger_->info("applied {} of the {} delta(s) after {}",
                r->info.deltas_applied(), restore.deltas.size(), path);
  if (r->info.deltas_ignored() > 0) {
    logger_->warn(
        "ignored {} checkpoint delta(s): {}; the updates they held are lost",
        r->info.deltas_ignored(), r->deltas_ignored_reason);
  }
  return r;
}

absl::StatusOr<CheckpointInfo> PsServer::Restore(
    const PsServerOptions& options) {
  const std::string path =
      CheckpointPath(options.checkpoint_dir, options.store.shard_index,
                     options.store.num_shards);
  if (!options.restore) {
    logger_->info(
        "not restoring {} (restore off; the next checkpoint and "
        "spec file replace the files)",
        path);
    return CheckpointInfo();
  }
  CheckpointInfo restored;
  absl::StatusOr<RestoredCheckpoint> r = ReadCheckpoint(options, path);
  if (r.ok()) {
    const bool adopted = r->identity.run_id() != options.run_id;
    adopted_ = adopted;
    if (adopted) {
      logger_->warn(
          "adopting checkpoint {} of run '{}' as run '{}': its parameters, "
          "optimizer state and versions are kept, its {} worker record(s) "
          "dropped",
          path, r->identity.run_id(), options.run_id, r->workers.size());
    } else {
      absl::Status imported = workers_->Import(r->workers);
      if (!imported.ok()) {
        return absl::DataLossError(
            absl::StrCat("checkpoint ", path, ": ", imported.message()));
      }
    }
    restored = r->info;
    const absl::Time taken = absl::FromUnixMillis(restored.unix_time_ms());
    logger_->info(
        "restored checkpoint {} taken {} ago ({} bytes, {} tensors, {} "
        "slices holding {} slice updates, {} tables, {} rows, {} workers) in "
        "{:.1f} ms; updates acknowledged after it are lost",
        restored.path(),
        absl::FormatDuration(
            absl::Trunc(clock_->Now() - taken, absl::Milliseconds(1))),
        restored.bytes(), restored.tensors(), restored.slices(),
        restored.slice_updates(), restored.tables(), restored.rows(),
        adopted ? 0 : restored.workers(), restored.duration_ms());
  } else if (absl::IsNotFound(r.status())) {
    logger_->info("no checkpoint at {}", path);
  } else {
    return r.status();
  }
  const std::string spec_path =
      SpecFilePath(options.checkpoint_dir, options.store.shard_index,
                   options.store.num_shards);
  absl::StatusOr<SpecFileContents> specs = ReadSpecFile(spec_path, options.fs);
  if (absl::IsNotFound(specs.status())) {
    if (!r.ok()) logger_->info("no spec file either; starting empty");
    return restored;
  }
  if (!specs.ok()) return specs.status();
  std::vector<std::string> without_values;
  absl::StatusOr<int> created =
      ApplySpecFile(*specs, spec_path, store_.get(), &without_values);
  if (!created.ok()) return created.status();
  restored_specs_ = *std::move(specs);
  if (!without_values.empty()) {
    logger_->error(
        "{} tensor(s) of {} were created with their values (INIT_VALUES) but "
        "no checkpoint holds them (their CreateTensor failed): {}; they are "
        "absent until created again",
        without_values.size(), spec_path, absl::StrJoin(without_values, ", "));
  }
  if (*created > 0) {
    logger_->warn(
        "created {} tensor(s)/table(s) from {} with their initial values: "
        "they were created after the last checkpoint{}, so their updates "
        "before this restart are lost",
        *created, spec_path, r.ok() ? "" : " (there is none)");
  }
  return restored;
}

std::string PsServer::address() const {
  const bool any = host_.empty() || host_ == "0.0.0.0" || host_ == "::";
  return absl::StrCat(any ? "127.0.0.1" : host_, ":", port_);
}

CheckpointImage PsServer::Capture(const DeltaChain* chain, uint32_t since) {
  // Evicted ids before `since` are in a durable checkpoint already.
  if (chain != nullptr) store_->tables().ForgetRemovedBefore(since);
  const absl::Time start = clock_->Now();
  PushGate::Closed closed(&gate_);
  const absl::Time held = clock_->Now();
  // Changes from now on go to the next delta.
  const uint32_t epoch = store_->AdvanceChangeEpoch();
  CheckpointImage image = chain == nullptr
                              ? CaptureCheckpoint(*store_, workers_->Export(),
                                                  held, kVersion, run_id_)
                              : CaptureDelta(*store_, workers_->Export(), held,
                                             since, *chain, kVersion, run_id_);
  image.epoch = epoch;
  image.pause = clock_->Now() - start;
  return image;
}

absl::StatusOr<FeedSnapshot> PsServer::Snapshot() {
  FeedSnapshot snapshot;
  CheckpointImage image;
  bool moving = false;
  log_->AtCut([&](uint64_t index, uint64_t epoch) {
    // A move's state in the middle of it (imports of slots not owned yet,
    // a source's fence) is in no checkpoint: a spare is sent its snapshot
    // before the move's first step or after its last (it asks again).
    moving = mover_ != nullptr && mover_->Moving();
    if (moving) return;
    image = Capture(nullptr, 0);
    snapshot.index = index;
    snapshot.epoch = epoch;
  });
  if (moving) {
    return absl::UnavailableError(
        "a slot move is in progress; the snapshot waits for its end");
  }
  snapshot.shard_epoch = service_->epoch();
  // The checkpoint file's exact bytes, written in memory (no disk, no
  // fsync): the spare writes and restores them as any checkpoint.
  MemoryFileSystem memory;
  constexpr char kDir[] = "/snapshot";
  absl::StatusOr<CheckpointInfo> written =
      WriteCheckpoint(image, kDir, clock_, &memory);
  if (!written.ok()) return written.status();
  snapshot.name = written->path().substr(sizeof(kDir));
  snapshot.bytes = memory.Take(written->path());
  return snapshot;
}

void PsServer::FillDigest(StatusResponse* response) {
  CheckpointImage image;
  uint64_t index = 0;
  if (log_ != nullptr) {
    log_->AtCut([&](uint64_t i, uint64_t) {
      image = Capture(nullptr, 0);
      index = i;
    });
  } else {
    image = Capture(nullptr, 0);
  }
  ReplicaStatus* r = response->mutable_replica();
  r->set_state_digest(StateDigest(image));
  r->set_log_index(index);
}

void PsServer::EvictIdleRows() {
  // Tables that evict under the cap keep some room free, so that requests
  // rarely wait for eviction; rows unused for row_ttl_steps steps of the
  // fastest live worker go. A replicated shard's primary logs what it
  // evicts; a backup evicts nothing of its own.
  if (store_->tables().totals().tables == 0) return;
  int64_t clock = 0;
  for (const WorkerInfo& w : workers_->Workers()) {
    if (w.live) clock = std::max(clock, w.clock);
  }
  const uint64_t evicted = service_->RunEviction(clock);
  if (evicted > 0) {
    logger_->debug("evicted {} row(s) (row_ttl_steps {}, clock {})", evicted,
                   store_->options().row_ttl_steps, clock);
  }
}

void PsServer::LingerIfDrained(absl::Duration quiet, absl::Duration most) {
  if (mover_ == nullptr || !mover_->drained()) return;
  // A client that still routes by the map from before the drain, or
  // retries a push part it sent here, gets a definite answer (the map to
  // route by, or a duplicate) instead of retrying at a stopped process
  // until its deadline.
  const absl::Time start = clock_->Now();
  uint64_t seen = stats_.DataCalls();
  const uint64_t first = seen;
  absl::Time last_call = start;
  while (clock_->Now() - last_call < quiet && clock_->Now() - start < most) {
    absl::SleepFor(absl::Milliseconds(50));
    const uint64_t now = stats_.DataCalls();
    if (now != seen) {
      seen = now;
      last_call = clock_->Now();
    }
  }
  logger_->info(
      "drained: answered {} call(s) routed by older maps in {} before "
      "stopping",
      seen - first,
      absl::FormatDuration(
          absl::Trunc(clock_->Now() - start, absl::Milliseconds(1))));
}

absl::Status PsServer::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock l(&shutdown_mu_);
    if (shut_down_) return absl::OkStatus();
    shut_down_ = true;
  }
  const absl::Time start = clock_->Now();
  logger_->info("shard shutting down");
  server_->GetHealthCheckService()->SetServingStatus(false);
  // Waiting pulls fail first, so their streams and calls can end; the data
  // streams stay open as long as their clients do, so the grace period
  // bounds the wait and then cancels what is left.
  workers_->Shutdown();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_->Wait();
  executor_.reset();  // runs what released pulls left queued
  StopSampler();
  absl::Status final_checkpoint;
  if (checkpointer_ != nullptr) {
    // Requested checkpoints were served while the calls drained; now no
    // update can arrive, so this one holds the final state.
    checkpointer_->Stop();
    final_checkpoint = checkpointer_->WriteNow().status();
  }
  logger_->info("shard stopped in {}",
                absl::FormatDuration(
                    absl::Trunc(clock_->Now() - start, absl::Milliseconds(1))));
  return final_checkpoint;
}

PsServer::~PsServer() {
  if (server_ != nullptr) Shutdown(absl::Seconds(1)).IgnoreError();
  StopSampler();
}

void PsServer::StopSampler() {
  if (!stop_sampler_.HasBeenNotified()) stop_sampler_.Notify();
  if (sampler_.joinable()) sampler_.join();
}

StatusResponse PsServer::GetStatus() {
  StatusResponse r;
  service_->FillStatus(&r);
  service_->FillSlotLoad(&r);
  return r;
}

}  // namespace asyncps
