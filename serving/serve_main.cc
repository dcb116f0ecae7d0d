// ps_serve: answers inference requests for the model an asyncps cluster
// trains, with dynamic batching, over the Open Inference Protocol (KServe
// v2) on gRPC and REST/JSON.
//
//   ps_serve --servers=h:p,h:p --port=8001 --http_port=8000
//   ps_serve --checkpoint_dir=/ckpt --port=8001
//
// Parameters come from the live shards (read without registering, every
// --refresh_s, into a second copy swapped in atomically) or from a
// checkpoint directory (restored again when its files change). SIGINT and
// SIGTERM stop it: queued requests are answered UNAVAILABLE, then it exits 0.
//
// Exit status: 0 after a clean stop; 1 when the parameters could not be
// read at start; 2 for bad flags or another start failure.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/accept_guard.h"
#include "common/call_ledger.h"
#include "common/cli.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/parse_refusal.h"
#include "common/port_file.h"
#include "common/request_guard.h"
#include "common/security.h"
#include "common/security_flags.h"
#include "common/version.h"
#include "kernels/cpu_backend.h"
#include "membership/etcd_flags.h"
#include "membership/shard_addressing.h"
#include "server/file_system.h"
#include "serving/batcher.h"
#include "serving/inference_handler.h"
#include "serving/kserve_service.h"
#include "serving/parameter_source.h"
#include "serving/rest_endpoint.h"
#include "serving/row_cache.h"
#include "serving/served_model.h"
#include "serving/serving_status.h"
#include "serving/snapshot.h"

ABSL_FLAG(std::string, servers, "",
          "Comma-separated shard addresses in shard order (serve the live "
          "model while it trains); an address with {i} stands for "
          "--num_shards addresses. Excludes --checkpoint_dir.");
ABSL_FLAG(int, num_shards, 0, "Shard count for a {i} pattern in --servers.");
ABSL_FLAG(std::string, run_id, "",
          "With --etcd_endpoints: the run whose shard map to follow (the "
          "shards' --run_id).");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "Serve the parameters of this checkpoint directory (no shards "
          "needed; re-read every --refresh_s when a shard wrote a newer "
          "checkpoint). Excludes --servers.");
ABSL_FLAG(std::string, model, "mlp",
          "The model ps_worker trains: mlp (Fashion-MNIST classifier) or ctr "
          "(the click model with embedding tables).");
ABSL_FLAG(int64_t, row_cache_rows, 100000,
          "ctr: embedding rows per table kept in the hot-row cache (refreshed "
          "with every snapshot).");
ABSL_FLAG(std::string, model_name, "",
          "Name clients use for the model; default = --model.");
ABSL_FLAG(double, refresh_s, 1.0,
          "Seconds between parameter snapshots read from the shards, or "
          "checks of --checkpoint_dir for newer files (0 = read once).");
ABSL_FLAG(std::string, host, "0.0.0.0", "Address to listen on.");
ABSL_FLAG(int, port, 0,
          "gRPC port (inference.GRPCInferenceService); 0 picks a free one "
          "(logged, and written to --port_file).");
ABSL_FLAG(std::string, port_file, "",
          "If set, the bound gRPC port is written here once serving.");
ABSL_FLAG(int, http_port, -1,
          "REST/JSON port (/v2/..., /metrics, /status); -1 = off, 0 picks a "
          "free one (written to --http_port_file).");
ABSL_FLAG(std::string, http_port_file, "",
          "If set, the bound HTTP port is written here (before --port_file).");
ABSL_FLAG(int, http_connections, 512,
          "REST connections served at once, each on a thread of its own; one "
          "more is answered 503.");
ABSL_FLAG(int, max_batch_size, 64,
          "Most rows computed together; also the most rows of one request.");
ABSL_FLAG(std::string, batch_timeout_us, "auto",
          "How long a batch waits for more requests: microseconds, or auto "
          "(chosen from the measured arrival rate and batch compute time).");
ABSL_FLAG(double, latency_slo_ms, 0,
          "With --batch_timeout_us=auto: keep the p99 latency under this "
          "while load allows (0 = minimise the mean only).");
ABSL_FLAG(int, max_queue, 1024,
          "Requests that may wait for a batch; beyond it RESOURCE_EXHAUSTED "
          "(HTTP 429) at once.");
ABSL_FLAG(int, batch_threads, 1,
          "Threads computing batches, each with its own model instance.");
ABSL_FLAG(std::string, device, "cpu", "Compute backend: cpu, cuda or auto.");
ABSL_FLAG(int, blas_threads, 1,
          "Threads OpenBLAS may use inside one batch's GEMM (CPU backend); 0 "
          "keeps OpenBLAS's own setting (OPENBLAS_NUM_THREADS, else every "
          "core). The batch threads and the request threads need the cores "
          "too: on 2 cores the wide MLP at 80% load took 5.3-6.4 ms a "
          "request with OpenBLAS's default, 2.0 ms with 1.");
ABSL_FLAG(int64_t, max_request_bytes, 64 << 20,
          "Largest request accepted: a larger gRPC request gets "
          "RESOURCE_EXHAUSTED, a larger REST body 413, before it is read.");
ABSL_FLAG(int64_t, max_unfinished_bytes, 0,
          "Most bytes all callers together may have sent in gRPC requests "
          "not yet whole (plus 4 KiB per open call): gRPC holds them before "
          "any check, so beyond it the connection holding the most is shut "
          "(common/request_guard.h). 0 = 4 x --max_request_bytes.");
ABSL_FLAG(int64_t, rpc_timeout_ms, 5000,
          "Deadline of one snapshot read from the shards.");
ABSL_FLAG(double, wait_s, 60,
          "How long to wait at start for the shards and the model's tensors "
          "(a training cluster that is still starting).");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error.");

namespace asyncps {
namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "ps_serve: %s\n", message.c_str());
  return 2;
}

struct Flags {
  BatcherOptions batcher;
  absl::Duration refresh;
  int blas_threads = 1;  // 0: OpenBLAS's own
  // gRPC holds a request's bytes until all of it has come, before any
  // check (4 connections of 200 calls announcing 16 MiB each and never
  // finishing took ps_serve from 27 MB to 1.8 GB in 8 s); the request
  // guard bounds them (common/request_guard.h).
  int64_t max_unfinished_bytes = 0;
};

absl::StatusOr<Flags> FlagsFromCommandLine() {
  Flags f;
  BatcherOptions& b = f.batcher;
  b.max_batch_rows = absl::GetFlag(FLAGS_max_batch_size);
  if (b.max_batch_rows < 1 || b.max_batch_rows > 65536) {
    return absl::InvalidArgumentError("--max_batch_size must be in [1, 65536]");
  }
  b.max_queue = absl::GetFlag(FLAGS_max_queue);
  if (b.max_queue < 1) {
    return absl::InvalidArgumentError("--max_queue must be >= 1");
  }
  b.threads = absl::GetFlag(FLAGS_batch_threads);
  if (b.threads < 1 || b.threads > 256) {
    return absl::InvalidArgumentError("--batch_threads must be in [1, 256]");
  }
  f.blas_threads = absl::GetFlag(FLAGS_blas_threads);
  if (f.blas_threads < 0 || f.blas_threads > 256) {
    return absl::InvalidArgumentError("--blas_threads must be in [0, 256]");
  }
  const std::string timeout = absl::GetFlag(FLAGS_batch_timeout_us);
  int64_t us = 0;
  if (timeout == "auto") {
    b.auto_timeout = true;
  } else if (absl::SimpleAtoi(timeout, &us) && us >= 0 && us <= 10000000) {
    b.timeout = absl::Microseconds(us);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--batch_timeout_us must be auto or microseconds in [0, 10000000], "
        "got '",
        timeout, "'"));
  }
  const double slo = absl::GetFlag(FLAGS_latency_slo_ms);
  if (!(slo >= 0) || slo > 3.6e6) {
    return absl::InvalidArgumentError("--latency_slo_ms must be >= 0");
  }
  if (slo > 0 && !b.auto_timeout) {
    return absl::InvalidArgumentError(
        "--latency_slo_ms needs --batch_timeout_us=auto");
  }
  b.latency_objective = absl::Milliseconds(slo);
  const double refresh = absl::GetFlag(FLAGS_refresh_s);
  if (!(refresh >= 0) || refresh > 86400) {
    return absl::InvalidArgumentError("--refresh_s must be in [0, 86400]");
  }
  f.refresh = absl::Seconds(refresh);
  if (absl::GetFlag(FLAGS_http_connections) < 1 ||
      absl::GetFlag(FLAGS_http_connections) > 4096) {
    return absl::InvalidArgumentError(
        "--http_connections must be in [1, 4096]");
  }
  const int64_t max_request = absl::GetFlag(FLAGS_max_request_bytes);
  if (max_request < 1024 || max_request > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        "--max_request_bytes must be in [1024, 2^30]");
  }
  f.max_unfinished_bytes = absl::GetFlag(FLAGS_max_unfinished_bytes);
  if (f.max_unfinished_bytes == 0) {
    f.max_unfinished_bytes = 4 * max_request;
  } else if (f.max_unfinished_bytes < max_request + CallLedger::kCallBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_unfinished_bytes must be 0 (auto) or at least "
                     "--max_request_bytes + 4096 (",
                     max_request + CallLedger::kCallBytes, "), got ",
                     f.max_unfinished_bytes));
  }
  if (absl::GetFlag(FLAGS_rpc_timeout_ms) < 1) {
    return absl::InvalidArgumentError("--rpc_timeout_ms must be >= 1");
  }
  return f;
}

absl::StatusOr<std::unique_ptr<ParameterSource>> SourceFromFlags(
    std::shared_ptr<spdlog::logger> logger) {
  const bool live =
      !absl::GetFlag(FLAGS_servers).empty() || !EtcdEndpointsFlag().empty();
  const std::string dir = absl::GetFlag(FLAGS_checkpoint_dir);
  if (live == !dir.empty()) {
    return absl::InvalidArgumentError(
        "give exactly one of --servers or --etcd_endpoints (live shards) and "
        "--checkpoint_dir");
  }
  if (!dir.empty()) {
    CheckpointSourceOptions options;
    options.dir = dir;
    options.fs = FileSystem::Default();  // the POSIX file system
    return MakeCheckpointSource(options);
  }
  ShardAddressingOptions a{absl::GetFlag(FLAGS_servers),
                           absl::GetFlag(FLAGS_num_shards), "",
                           absl::GetFlag(FLAGS_run_id)};
  a.router.wait_for_map = absl::Seconds(absl::GetFlag(FLAGS_wait_s));
  a.router.logger = logger;
  std::vector<std::string> etcd_warnings;
  if (absl::Status s = AddEtcdFlags(&a, &etcd_warnings); !s.ok()) return s;
  for (const std::string& w : etcd_warnings) logger->warn("{}", w);
  absl::StatusOr<ShardAddressing> shards = ResolveShardAddressing(a);
  if (!shards.ok()) {  // a start failure: exit 2, as bad flags
    return absl::InvalidArgumentError(shards.status().message());
  }
  std::vector<std::string> warnings;
  absl::StatusOr<SecurityOptions> security =
      SecurityOptionsFromFlags(/*server=*/false, &warnings);
  if (!security.ok()) return security.status();
  for (const std::string& w : warnings) logger->warn("{}", w);
  PsClientOptions c;
  c.servers = shards->servers;
  c.router = shards->router;
  c.run_id = absl::GetFlag(FLAGS_run_id);
  c.security = *security;
  c.logger = logger;
  c.connections_per_shard = 1;
  c.retry.attempt_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_rpc_timeout_ms));
  c.retry.call_deadline = c.retry.attempt_timeout;
  return MakeShardSource(std::move(c));
}

// The flags that name what is served.
absl::Status ModelFlags() {
  if (absl::GetFlag(FLAGS_model) != "mlp" &&
      absl::GetFlag(FLAGS_model) != "ctr") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--model must be mlp or ctr, got '", absl::GetFlag(FLAGS_model), "'"));
  }
  if (absl::GetFlag(FLAGS_row_cache_rows) < 1) {
    return absl::InvalidArgumentError("--row_cache_rows must be >= 1");
  }
  return absl::OkStatus();
}

// The model of --model as `source` holds it, retried for --wait_s (the
// shards may still be starting, and the first worker creating the
// tensors). *stopped says that a stop signal of `signals` came meanwhile
// (the status is then the last try's).
absl::StatusOr<ServedModel> WaitForModel(ParameterSource* source,
                                         RowCache* rows, int max_batch_rows,
                                         const sigset_t& signals,
                                         bool* stopped) {
  *stopped = false;
  const absl::Time wait_until =
      absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_wait_s));
  for (;;) {
    absl::StatusOr<ListTensorsResponse> specs = source->List();
    absl::StatusOr<ServedModel> served =
        specs.ok() ? DescribeServedModel(absl::GetFlag(FLAGS_model), *specs,
                                         max_batch_rows,
                                         absl::GetFlag(FLAGS_device), rows)
                   : absl::StatusOr<ServedModel>(specs.status());
    if (served.ok() || absl::Now() >= wait_until) return served;
    struct timespec zero {};
    if (sigtimedwait(&signals, nullptr, &zero) > 0) {
      *stopped = true;
      return served;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
}

// The served model's signature under --model_name; the batcher's shapes
// and rows follow it.
ModelSignature Signature(const ServedModel& served, BatcherOptions* batcher) {
  ModelSignature model = served.signature;
  model.name = absl::GetFlag(FLAGS_model_name).empty()
                   ? absl::GetFlag(FLAGS_model)
                   : absl::GetFlag(FLAGS_model_name);
  model.max_rows = batcher->max_batch_rows;
  batcher->input_dim = model.input_dim;
  batcher->ids_per_row = model.ids_per_row;
  batcher->output_dim = model.output_dim;
  return model;
}

// The KServe gRPC server on --host:--port; *port is the one bound.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpc(KServeService* service,
                                                        int* port) {
  const std::string host = absl::GetFlag(FLAGS_host);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat(host, ":", absl::GetFlag(FLAGS_port)),
                           grpc::InsecureServerCredentials(), port);
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(absl::GetFlag(FLAGS_max_request_bytes)));
  // As on a shard: a connection that has not finished its handshake in 10
  // s goes (gRPC's default is 120 s).
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 10000);
  builder.RegisterService(service);
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(ParseRefusalFactory({}));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || *port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", host, ":",
                                               absl::GetFlag(FLAGS_port)));
  }
  return server;
}

// The REST endpoint on --host:--http_port (null when off), its port
// written to --http_port_file.
absl::StatusOr<std::unique_ptr<RestEndpoint>> StartRest(
    InferenceHandler* handler, const ServingStatus* status,
    spdlog::logger& logger) {
  if (absl::GetFlag(FLAGS_http_port) < 0) return nullptr;
  const std::string host = absl::GetFlag(FLAGS_host);
  auto rest = std::make_unique<RestEndpoint>(
      handler, kVersion, absl::GetFlag(FLAGS_http_connections),
      static_cast<size_t>(absl::GetFlag(FLAGS_max_request_bytes)),
      [status] { return status->Metrics(); },
      [status] { return status->Line(); });
  absl::StatusOr<int> http = rest->Start(host, absl::GetFlag(FLAGS_http_port));
  if (!http.ok()) return http.status();
  logger.info("REST on {}:{}", host, *http);
  if (!absl::GetFlag(FLAGS_http_port_file).empty()) {
    absl::Status s = WritePortFile(absl::GetFlag(FLAGS_http_port_file), *http);
    if (!s.ok()) return s;
  }
  return rest;
}

int Main(int argc, char** argv) {
  ProgramInfo program;
  program.name = "ps_serve";
  program.version = kVersion;
  program.flags_only = true;
  program.usage =
      "ps_serve: answers inference requests (KServe v2 over gRPC and\n"
      "REST) for the model an asyncps cluster trains, with dynamic\n"
      "batching, from the live shards or a checkpoint directory.\n\n"
      "  ps_serve --servers=h:p,h:p --port=8001 --http_port=8000\n"
      "  ps_serve --etcd_endpoints=h:p --run_id=R --port=8001\n"
      "  ps_serve --checkpoint_dir=DIR --port=8001\n\n"
      "Exit status: 0 after SIGINT/SIGTERM; 1 when the parameters could not\n"
      "be read at start; 2 for bad flags or another start failure.";
  const sigset_t signals = BlockStopSignals();
  const ParseResult parsed = ParseProgramCommandLine(argc, argv, program);
  if (!parsed.command_line.has_value()) return parsed.exit_code;
  absl::StatusOr<Flags> flags = FlagsFromCommandLine();
  if (!flags.ok()) return Fail(std::string(flags.status().message()));
  if (absl::Status m = ModelFlags(); !m.ok()) {
    return Fail(std::string(m.message()));
  }
  if (flags->blas_threads > 0) SetCpuGemmThreads(flags->blas_threads);
  absl::StatusOr<std::shared_ptr<spdlog::logger>> logger =
      MakeLogger("serve", absl::GetFlag(FLAGS_log_level));
  if (!logger.ok()) return Fail(std::string(logger.status().message()));
  for (const std::string& w : parsed.command_line->warnings) {
    (*logger)->warn("{}", w);
  }
  RouteGrpcLogs(*logger, spdlog::level::debug);
  // Process tuning (common/net.h), descriptors kept (common/accept_guard.h).
  TuneProcess();
  GuardAccepts();

  absl::StatusOr<std::unique_ptr<ParameterSource>> source =
      SourceFromFlags(*logger);
  if (!source.ok()) {
    if (absl::IsInvalidArgument(source.status())) {
      return Fail(std::string(source.status().message()));
    }
    (*logger)->error("cannot read parameters: {}", source.status().ToString());
    return 1;
  }
  RowCache rows(source->get(), absl::GetFlag(FLAGS_row_cache_rows));
  bool stopped = false;
  absl::StatusOr<ServedModel> served = WaitForModel(
      source->get(), &rows, flags->batcher.max_batch_rows, signals, &stopped);
  if (stopped) return 0;
  if (!served.ok()) {
    (*logger)->error("cannot read the model from {}: {}", (*source)->Describe(),
                     served.status().ToString());
    return 1;
  }
  SnapshotKeeper snapshots(source->get(), served->tensors, flags->refresh,
                           *logger);
  if (absl::Status s = snapshots.Refresh(); !s.ok()) {
    (*logger)->error("cannot read the first snapshot: {}", s.ToString());
    return 1;
  }
  const ModelSignature model = Signature(*served, &flags->batcher);

  ServingMetrics metrics;
  absl::StatusOr<std::unique_ptr<Batcher>> batcher =
      Batcher::Create(flags->batcher, served->runners, &snapshots, &metrics);
  if (!batcher.ok()) return Fail(batcher.status().ToString());
  InferenceHandler handler(model, batcher->get(), &snapshots, &metrics);
  ServingStatus status(&handler, batcher->get(), &snapshots, source->get());
  KServeService service(&handler, kVersion);
  int port = 0;
  absl::StatusOr<std::unique_ptr<grpc::Server>> server =
      StartGrpc(&service, &port);
  if (!server.ok()) return Fail(std::string(server.status().message()));
  GuardUnfinishedRequests(port, flags->max_unfinished_bytes);
  absl::StatusOr<std::unique_ptr<RestEndpoint>> rest =
      StartRest(&handler, &status, **logger);
  if (!rest.ok()) return Fail(rest.status().ToString());
  snapshots.Start();
  (*logger)->info(
      "serving model '{}' ({}) from {} on {}:{}; batches of up to {} rows, "
      "timeout {}, {} batch thread(s) on {}",
      model.name, served->summary, (*source)->Describe(),
      absl::GetFlag(FLAGS_host), port, flags->batcher.max_batch_rows,
      flags->batcher.auto_timeout
          ? std::string("auto")
          : absl::FormatDuration(flags->batcher.timeout),
      flags->batcher.threads, absl::GetFlag(FLAGS_device));
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    absl::Status s = WritePortFile(absl::GetFlag(FLAGS_port_file), port);
    if (!s.ok()) return Fail(s.ToString());
  }

  int sig = 0;
  sigwait(&signals, &sig);
  (*logger)->info("signal {}: stopping; {}", sig, status.Line());
  snapshots.Stop();
  (*batcher)->Stop();
  (*server)->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  if (*rest != nullptr) (*rest)->Stop();
  return 0;
}

}  // namespace
}  // namespace asyncps

int main(int argc, char** argv) { return asyncps::Main(argc, argv); }
