// ps_server: one shard of an asyncps parameter-server cluster.
//
//   ps_server --shard_index=0 --num_shards=2 --port=7000
//             --consistency=ssp --ssp_slack=3 --max_staleness=8
//             --staleness_lr=inverse
//
// Flags are parsed here into PsServerOptions and nowhere else. SIGINT and
// SIGTERM shut the shard down cleanly (with --checkpoint_dir, after writing
// a final checkpoint).
//
// Exit status: 0 after a clean shutdown, 1 when the checkpoint could not be
// restored at start or the final one could not be written, 2 for bad flags,
// a checkpoint directory holding another shard count's or another run's
// files, or another start failure.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/accept_guard.h"
#include "common/call_ledger.h"
#include "common/cli.h"
#include "common/identity.h"
#include "common/logging.h"
#include "common/memory_limit.h"
#include "common/net.h"
#include "common/port_file.h"
#include "common/request_guard.h"
#include "common/reserved_port.h"
#include "common/security.h"
#include "common/security_flags.h"
#include "common/shard_map.h"
#include "common/version.h"
#include "membership/etcd_flags.h"
#include "server/checkpoint_dir.h"
#include "server/checkpoint_setup.h"
#include "server/file_system.h"
#include "server/health_listener.h"
#include "server/metrics_http.h"
#include "server/ps_server.h"
#include "server/replica_setup.h"
#include "server/runtime_metrics.h"
#include "server/starting_map.h"

ABSL_FLAG(std::string, host, "0.0.0.0", "Address to listen on.");
ABSL_FLAG(int, port, 0,
          "Port to listen on; 0 picks a free one (logged, "
          "and written to --port_file).");
ABSL_FLAG(std::string, port_file, "",
          "If set, the bound port is written to this file once serving.");
ABSL_FLAG(int64_t, max_message_bytes, asyncps::kMaxMessageBytes,
          "Largest request a shard accepts; larger ones get "
          "RESOURCE_EXHAUSTED before they are read.");
ABSL_FLAG(int64_t, max_unfinished_bytes, 0,
          "Most bytes all callers together may have sent in gRPC messages "
          "not yet whole (plus 4 KiB per open call): gRPC holds them before "
          "any check, so beyond it the connection holding the most is shut "
          "(common/request_guard.h). 0 = the larger of 1 GiB and 4 x "
          "--max_message_bytes.");
ABSL_FLAG(std::string, advertise_address, "",
          "host:port this shard reports in Status and logs (e.g. the name "
          "workers dial); empty = the address actually bound, e.g. "
          "0.0.0.0:7000.");
ABSL_FLAG(int, metrics_port, -1,
          "Port for the Prometheus endpoint (GET /metrics) on "
          "--metrics_host; -1 = off, 0 picks a free one (logged, and written "
          "to --metrics_port_file).");
ABSL_FLAG(std::string, metrics_host, "",
          "Address the Prometheus endpoint listens on; empty = --host (with "
          "the default --host=0.0.0.0: '::', IPv6 and IPv4, where the kernel "
          "has IPv6). The endpoint is plain HTTP without the token: keep it "
          "private.");
ABSL_FLAG(std::string, metrics_port_file, "",
          "If set, the bound metrics port is written to this file; it is "
          "written before --port_file.");
ABSL_FLAG(std::string, shard_index, "0",
          "This shard's index in [0, num_shards), or auto: the ordinal at the "
          "end of the host name, as a Kubernetes StatefulSet pod has it "
          "(asyncps-shard-2 -> 2), or any (--replicas >= 2): a spare replica "
          "of whichever shard group has fewer than R, standing by until one "
          "has.");
ABSL_FLAG(int, health_port, -1,
          "Also serve grpc.health.v1.Health alone on this port of --host, "
          "plain TCP without token (requests of at most 4 KiB), for probes "
          "that cannot do TLS or send the --cluster_token_file token, which "
          "health checks on --port need too (e.g. Kubernetes gRPC probes); "
          "-1 = off, 0 picks a free one (written to "
          "--health_port_file). Up before the checkpoint is restored: "
          "NOT_SERVING until the shard serves (a startup probe waits for "
          "the restore), NOT_SERVING again once it stops.");
ABSL_FLAG(std::string, health_port_file, "",
          "If set, the bound health port is written to this file (before "
          "--port_file).");
ABSL_FLAG(int, num_shards, 1, "Number of shards in the cluster.");
ABSL_FLAG(int, num_slots, 0,
          "The run's shard map when it is created: 0 = the static map "
          "(keys by hash mod --num_shards); S = S slots (e.g. 4096) spread "
          "evenly, moved between shards by psctl rebalance / reshard --map. "
          "Every shard of a run gives the same value; a shard restoring "
          "files serves the map they hold (0 accepts it).");
ABSL_FLAG(int, serving_shards, 0,
          "With --num_slots: 0 = the slots of a new run are spread over "
          "every shard; K = over shards 0..K-1 only, the others standing by "
          "with no slot until psctl scale moves slots to them. Every shard "
          "of a run gives the same value; restored files' maps win.");
ABSL_FLAG(double, move_copy_mb_s, 0,
          "Live moves out of this shard: the copy rounds before the fence "
          "send at most this many MB/s (1e6 bytes), leaving the cores to "
          "training; the fenced round is never held back. 0 = as fast as "
          "it goes.");
ABSL_FLAG(int64_t, slice_elems, 4096,
          "Default slice size in float32 elements for tensors whose spec "
          "leaves it at 0. Every shard must use the same value.");
ABSL_FLAG(std::string, consistency, "asp",
          "Read-side consistency model: asp (never wait), ssp (stale "
          "synchronous, see --ssp_slack) or bsp (lock-step).");
ABSL_FLAG(int64_t, ssp_slack, -1,
          "SSP only: a pull at clock c waits until every live worker has "
          "clock >= c - slack. Default 3 when --consistency=ssp.");
ABSL_FLAG(int64_t, max_staleness, -1,
          "Refuse a pushed slice gradient computed from a version more than "
          "this many updates old; -1 = unbounded.");
ABSL_FLAG(std::string, staleness_lr, "none",
          "none, or inverse: learning rate / (1 + staleness) per slice.");
ABSL_FLAG(int64_t, worker_lease_ms, 10000,
          "A worker silent this long is evicted from the clock computation.");
ABSL_FLAG(int64_t, pull_wait_timeout_ms, 60000,
          "Longest an SSP/BSP pull waits before DEADLINE_EXCEEDED.");
ABSL_FLAG(std::string, max_parameter_bytes, "auto",
          "Most bytes this shard's tensors may take (values, optimizer state "
          "and bookkeeping of its slices, and the rows of its sparse tables), "
          "checked before anything is allocated: a CreateTensor, or a pull or "
          "push creating rows, beyond it is RESOURCE_EXHAUSTED. A byte "
          "count (suffixes K, M, G, T: powers of 1024), or auto = 40% of the "
          "memory this process may use: the machine's physical memory, or its "
          "cgroup's memory limit (container, pod, job) when lower (a "
          "checkpoint needs about as much again while it is captured).");
ABSL_FLAG(int64_t, row_ttl_steps, 0,
          "Evict sparse table rows not pulled or pushed for this many steps "
          "(clock ticks of the fastest live worker); an evicted row comes "
          "back with its initial values when next touched. 0 = never.");
ABSL_FLAG(std::string, log_level, "info",
          "trace, debug, info, warn, error or off.");

namespace asyncps {
namespace {

// --max_parameter_bytes=auto: this share of the memory the process may use.
constexpr uint64_t kAutoCapPercent = 40;

// A byte count with an optional K/M/G/T suffix (powers of 1024), > 0.
absl::StatusOr<uint64_t> ParseByteSize(const std::string& text) {
  absl::string_view digits = text;
  uint64_t unit = 1;
  if (!digits.empty()) {
    switch (absl::ascii_toupper(digits.back())) {
      case 'K':
        unit = uint64_t{1} << 10;
        break;
      case 'M':
        unit = uint64_t{1} << 20;
        break;
      case 'G':
        unit = uint64_t{1} << 30;
        break;
      case 'T':
        unit = uint64_t{1} << 40;
        break;
      default:
        break;
    }
    if (unit != 1) digits.remove_suffix(1);
  }
  uint64_t n = 0, bytes = 0;
  if (!absl::SimpleAtoi(digits, &n) || n == 0 ||
      __builtin_mul_overflow(n, unit, &bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a positive byte count: '", text, "'"));
  }
  return bytes;
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "ps_server: %s\n", message.c_str());
  return 2;
}

// Each *Flags step below reads a group of flags into `o`; the error names
// the flag.

// Where the shard listens and what it reports.
absl::Status AddressFlags(PsServerOptions* o) {
  o->host = absl::GetFlag(FLAGS_host);
  o->port = absl::GetFlag(FLAGS_port);
  if (o->port < 0 || o->port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--port must be in [0, 65535], got ", o->port));
  }
  const int64_t max_message = absl::GetFlag(FLAGS_max_message_bytes);
  if (max_message < 1024 || max_message > (int64_t{1} << 31) - 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_message_bytes must be in [1024, 2^31 - 1], got ", max_message));
  }
  o->max_message_bytes = static_cast<int>(max_message);
  const int metrics_port = absl::GetFlag(FLAGS_metrics_port);
  if (metrics_port < -1 || metrics_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_port must be -1 (off) or in [0, 65535], got ",
                     metrics_port));
  }
  const int health_port = absl::GetFlag(FLAGS_health_port);
  if (health_port < -1 || health_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--health_port must be -1 (off) or in [0, 65535], got ", health_port));
  }
  o->advertise_address = absl::GetFlag(FLAGS_advertise_address);
  if (!o->advertise_address.empty()) {
    absl::Status address = CheckHostPort(o->advertise_address);
    if (!address.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--advertise_address: ", address.message()));
    }
  }
  return absl::OkStatus();
}

// Which shard of how many, and the default slice size.
absl::Status ShardFlags(PsServerOptions* o) {
  o->store.num_shards = absl::GetFlag(FLAGS_num_shards);
  if (o->store.num_shards < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--num_shards must be >= 1, got ", o->store.num_shards));
  }
  // "any": a spare replica of whichever group needs one (its group is
  // chosen in etcd when it joins; CheckReplicaFlags says what it needs).
  absl::StatusOr<int> index =
      absl::GetFlag(FLAGS_shard_index) == "any"
          ? absl::StatusOr<int>(kAnyShard)
          : ResolveIndexFlag("shard_index", absl::GetFlag(FLAGS_shard_index),
                             AutoIndexSource::kHostnameOrdinal,
                             CurrentHostname(), std::nullopt);
  if (!index.ok()) return index.status();
  o->store.shard_index = *index;
  if (o->store.shard_index >= o->store.num_shards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--shard_index must be in [0, --num_shards=", o->store.num_shards,
        "), got ", o->store.shard_index));
  }
  o->num_slots = absl::GetFlag(FLAGS_num_slots);
  o->serving_shards = absl::GetFlag(FLAGS_serving_shards);
  if (o->serving_shards != 0 && o->store.shard_index != kAnyShard) {
    // The map's own checks (server/starting_map.h), with the flags' words;
    // the same check the shard makes at Start, made before anything else.
    absl::Status s =
        StartingShardMap({"", false, o->store.shard_index, o->store.num_shards,
                          o->num_slots, nullptr, o->serving_shards})
            .status();
    if (!s.ok()) return s;
  } else if (o->num_slots != 0 && (o->num_slots < o->store.num_shards ||
                                   o->num_slots > ShardMap::kMaxSlots)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--num_slots must be 0 (static map) or in [--num_shards=",
                     o->store.num_shards, ", ", ShardMap::kMaxSlots, "], got ",
                     o->num_slots));
  }
  o->move_copy_mb_s = absl::GetFlag(FLAGS_move_copy_mb_s);
  if (!(o->move_copy_mb_s >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--move_copy_mb_s must be >= 0, got ", o->move_copy_mb_s));
  }
  o->store.default_slice_elems = absl::GetFlag(FLAGS_slice_elems);
  if (o->store.default_slice_elems < 1 ||
      o->store.default_slice_elems > o->store.max_slice_elems) {
    return absl::InvalidArgumentError(
        absl::StrCat("--slice_elems must be in [1, ", o->store.max_slice_elems,
                     "], got ", o->store.default_slice_elems));
  }
  return absl::OkStatus();
}

// The consistency model and its slack.
absl::Status ConsistencyFlags(PsServerOptions* o) {
  const std::string mode = absl::GetFlag(FLAGS_consistency);
  const int64_t slack = absl::GetFlag(FLAGS_ssp_slack);
  if (mode == "asp" || mode == "bsp") {
    o->workers.consistency = mode == "asp" ? ASP : BSP;
    if (slack != -1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--ssp_slack applies only to --consistency=ssp (got --consistency=",
          mode, ")"));
    }
  } else if (mode == "ssp") {
    o->workers.consistency = SSP;
    if (slack < -1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--ssp_slack must be >= 0, got ", slack));
    }
    o->workers.ssp_slack = slack == -1 ? 3 : slack;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--consistency must be asp, ssp or bsp, got '", mode, "'"));
  }
  return absl::OkStatus();
}

// The staleness rule, worker leases and pull waits.
absl::Status StalenessFlags(PsServerOptions* o) {
  o->staleness.max_staleness = absl::GetFlag(FLAGS_max_staleness);
  if (o->staleness.max_staleness < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_staleness must be >= 0, or -1 for unbounded; got ",
                     o->staleness.max_staleness));
  }
  const std::string lr = absl::GetFlag(FLAGS_staleness_lr);
  if (lr != "none" && lr != "inverse") {
    return absl::InvalidArgumentError(
        absl::StrCat("--staleness_lr must be none or inverse, got '", lr, "'"));
  }
  o->staleness.inverse_lr = lr == "inverse";
  const int64_t lease = absl::GetFlag(FLAGS_worker_lease_ms);
  if (lease < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--worker_lease_ms must be >= 1, got ", lease));
  }
  o->workers.worker_lease = absl::Milliseconds(lease);
  const int64_t wait = absl::GetFlag(FLAGS_pull_wait_timeout_ms);
  if (wait < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--pull_wait_timeout_ms must be >= 1, got ", wait));
  }
  o->workers.pull_wait_timeout = absl::Milliseconds(wait);
  return absl::OkStatus();
}

// The memory cap and row eviction; *cap_source says where an automatic
// cap came from ("" for a given one).
absl::Status MemoryFlags(PsServerOptions* o, std::string* cap_source) {
  const std::string cap_flag = absl::GetFlag(FLAGS_max_parameter_bytes);
  if (cap_flag == "auto") {
    absl::StatusOr<MemoryLimit> memory = ReadMemoryLimit();
    if (!memory.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--max_parameter_bytes=auto: ", memory.status().message(),
          "; give a byte count such as 8G"));
    }
    o->store.max_parameter_bytes = memory->effective() / 100 * kAutoCapPercent;
    *cap_source =
        memory->cgroup_bytes.has_value()
            ? absl::StrCat(kAutoCapPercent, "% of the memory limit ",
                           *memory->cgroup_bytes, " bytes of ",
                           memory->cgroup_file)
            : absl::StrCat(kAutoCapPercent, "% of the physical memory ",
                           memory->physical_bytes, " bytes");
  } else {
    absl::StatusOr<uint64_t> cap = ParseByteSize(cap_flag);
    if (!cap.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--max_parameter_bytes: must be auto or a positive byte count such "
          "as 8G, got '",
          cap_flag, "'"));
    }
    o->store.max_parameter_bytes = *cap;
  }
  o->store.row_ttl_steps = absl::GetFlag(FLAGS_row_ttl_steps);
  if (o->store.row_ttl_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--row_ttl_steps must be >= 0 (0 = never), got ",
                     o->store.row_ttl_steps));
  }
  return absl::OkStatus();
}

// Turns flags into options; the error names the flag.
absl::StatusOr<PsServerOptions> OptionsFromFlags() {
  PsServerOptions o;
  std::string cap_source;
  absl::Status s = AddressFlags(&o);
  if (s.ok()) s = ShardFlags(&o);
  if (s.ok()) s = ConsistencyFlags(&o);
  if (s.ok()) s = StalenessFlags(&o);
  if (s.ok()) s = MemoryFlags(&o, &cap_source);
  if (s.ok()) s = CheckpointFlags(&o);
  if (!s.ok()) return s;
  std::vector<std::string> warnings;
  absl::StatusOr<SecurityOptions> sec =
      SecurityOptionsFromFlags(/*server=*/true, &warnings);
  if (!sec.ok()) return sec.status();
  o.security = *std::move(sec);
  absl::StatusOr<std::shared_ptr<spdlog::logger>> logger =
      MakeLogger(o.store.shard_index == kAnyShard
                     ? std::string("spare")
                     : absl::StrCat("shard", o.store.shard_index),
                 absl::GetFlag(FLAGS_log_level));
  if (!logger.ok()) return logger.status();
  o.logger = *logger;
  for (const std::string& w : warnings) o.logger->warn("{}", w);
  if (!cap_source.empty()) {
    o.logger->info("--max_parameter_bytes=auto: {} bytes ({})",
                   o.store.max_parameter_bytes, cap_source);
  }
  return o;
}

// --max_unfinished_bytes, 0 resolved.
absl::StatusOr<int64_t> UnfinishedBudget(int64_t max_message_bytes) {
  const int64_t flag = absl::GetFlag(FLAGS_max_unfinished_bytes);
  if (flag == 0) {
    return std::max<int64_t>(int64_t{1} << 30, 4 * max_message_bytes);
  }
  if (flag < max_message_bytes + CallLedger::kCallBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_unfinished_bytes must be 0 (auto) or at least "
        "--max_message_bytes + 4096 (",
        max_message_bytes + CallLedger::kCallBytes, "), got ", flag));
  }
  return flag;
}

// Raises the open-files limit and keeps descriptors free of connection
// floods (common/accept_guard.h).
void GuardDescriptors(spdlog::logger& logger) {
  const AcceptGuardReport fds = GuardAccepts();
  logger.info(
      "open files: limit {} (hard {}); connections beyond descriptor {} are "
      "refused",
      fds.soft_limit, fds.hard_limit, fds.ceiling);
}

// The health listener (--health_port), started NOT_SERVING; null when off.
// The error is the message to exit with.
absl::StatusOr<std::unique_ptr<HealthListener>> StartHealth(
    spdlog::logger& logger) {
  const int health_port = absl::GetFlag(FLAGS_health_port);
  if (health_port < 0) return nullptr;
  absl::StatusOr<std::unique_ptr<HealthListener>> health =
      HealthListener::Start(absl::GetFlag(FLAGS_host), health_port,
                            {PsServer::kServiceName}, /*serving=*/false);
  if (!health.ok()) {
    return absl::UnavailableError("--health_port: " +
                                  health.status().ToString());
  }
  GuardUnfinishedRequests((*health)->port(),
                          HealthListener::kMaxUnfinishedBytes);
  logger.info(
      "health checks (plain TCP) on port {}: NOT_SERVING until the shard "
      "has restored and serves ({}: SERVING while the process runs)",
      (*health)->port(), HealthListener::kProcessService);
  const std::string health_file = absl::GetFlag(FLAGS_health_port_file);
  if (!health_file.empty()) {
    absl::Status written = WritePortFile(health_file, (*health)->port());
    if (!written.ok()) {
      return absl::Status(written.code(), absl::StrCat("--health_port_file: ",
                                                       written.message()));
    }
  }
  return health;
}

// The exit status for a shard that did not start: 1 when its checkpoint
// cannot be restored, 2 otherwise.
int StartFailure(const absl::Status& s, bool restore) {
  if (restore && (absl::IsDataLoss(s) || absl::IsFailedPrecondition(s) ||
                  absl::IsResourceExhausted(s))) {
    std::fprintf(
        stderr,
        "ps_server: cannot restore: %s\n(%sstart with "
        "--restore=false to start empty, losing what the files "
        "hold; the next checkpoint replaces them)\n",
        s.ToString().c_str(),
        absl::IsResourceExhausted(s) ? "raise --max_parameter_bytes, or " : "");
    return 1;
  }
  return Fail(s.ToString());
}

// The Prometheus lines beside the shard's Status: calls per method, refused
// tokens, failed TLS handshakes and the process's own figures.
std::string ProcessMetrics(const RpcMetrics& rpc_metrics,
                           const AuthRefusals& auth_refusals,
                           const std::string& shard_label) {
  std::string out;
  rpc_metrics.AppendPrometheus(shard_label, &out);
  auth_refusals.AppendPrometheus(shard_label, &out);
  absl::StrAppend(
      &out,
      "# HELP asyncps_tls_handshakes_failed_total TLS handshakes with "
      "clients that failed (no, foreign or expired certificate, or no "
      "TLS).\n# TYPE asyncps_tls_handshakes_failed_total counter\n",
      "asyncps_tls_handshakes_failed_total{", shard_label, "} ",
      GrpcHandshakeFailures(), "\n");
  AppendProcessMetrics(shard_label, &out);
  return out;
}

// Starts `metrics` on --metrics_host:--metrics_port (when on) and writes
// --metrics_port_file. The error is the message to exit with.
absl::Status StartMetrics(MetricsHttpServer* metrics, spdlog::logger& logger) {
  const int metrics_port = absl::GetFlag(FLAGS_metrics_port);
  if (metrics_port < 0) return absl::OkStatus();
  std::string metrics_host = absl::GetFlag(FLAGS_metrics_host);
  if (metrics_host.empty()) metrics_host = absl::GetFlag(FLAGS_host);
  absl::StatusOr<int> bound;
  if (absl::GetFlag(FLAGS_metrics_host).empty() && metrics_host == "0.0.0.0") {
    // Every address: dual-stack "::" where the kernel has IPv6 (so that
    // IPv6-only clusters can scrape), IPv4 only where it has not.
    bound = metrics->Start("::", metrics_port);
    if (bound.ok()) {
      metrics_host = "[::]";
    } else {
      bound = metrics->Start(metrics_host, metrics_port);
    }
  } else {
    bound = metrics->Start(metrics_host, metrics_port);
  }
  if (!bound.ok()) {
    return absl::UnavailableError("--metrics_port: " +
                                  bound.status().ToString());
  }
  logger.info("Prometheus metrics on http://{}:{}/metrics", metrics_host,
              *bound);
  const std::string metrics_file = absl::GetFlag(FLAGS_metrics_port_file);
  if (!metrics_file.empty()) {
    absl::Status written = WritePortFile(metrics_file, *bound);
    if (!written.ok()) {
      return absl::Status(written.code(), absl::StrCat("--metrics_port_file: ",
                                                       written.message()));
    }
  }
  return absl::OkStatus();
}

// Serves until SIGINT or SIGTERM (0), or until the shard group says this
// process must start over (-1), then stops: health NOT_SERVING, the
// metrics endpoint, the shard (in-flight calls, then the final checkpoint),
// the health listener. The exit status, or -1.
int ServeUntilSignal(const sigset_t& signals, PsServer* server,
                     HealthListener* health, MetricsHttpServer* metrics,
                     ReplicaGroup* group, spdlog::logger& logger) {
  int sig = 0;
  std::string why;
  const timespec tick = {0, 200 * 1000 * 1000};
  if (group == nullptr) {
    while (sigwait(&signals, &sig) != 0) {
    }
  } else {
    // Also wakes up to see whether the group wants this process to start
    // over.
    while ((sig = sigtimedwait(&signals, nullptr, &tick)) <= 0 &&
           !group->must_restart(&why)) {
    }
  }
  if (sig > 0) {
    logger.info("received signal {}; shutting down", sig);
    server->LingerIfDrained(absl::Seconds(1), absl::Seconds(30));
  } else {
    logger.warn("starting over as a spare of the shard group: {}", why);
  }
  if (health != nullptr) health->SetServing(false);
  metrics->Stop();
  if (group != nullptr) group->Stop();
  const absl::Status final_checkpoint = server->Shutdown();
  if (health != nullptr) health->Stop();
  if (sig <= 0) return -1;
  if (!final_checkpoint.ok()) {
    std::fprintf(stderr, "ps_server: final checkpoint failed: %s\n",
                 final_checkpoint.ToString().c_str());
    return 1;
  }
  return 0;
}

// Joins the shard group of a replicated run (*group null when the run is
// not replicated): -1 to go on, else the exit status (0 for SIGTERM before
// it joined, e.g. while standing by; 2 for a failure, said); *temp_dir is
// removed then. *port holds the port it advertised when --port is 0; a
// spare of any shard locks the files of the shard it chose in *files.
int JoinGroup(const ReplicaFlags& flags, const sigset_t& signals,
              PsServerOptions* options, std::string* temp_dir,
              std::unique_ptr<ReplicaGroup>* group, ReservedPort* port,
              ShardFilesLock* files) {
  ReplicaHooks hooks;
  hooks.stopping = [&signals] { return StopSignalPending(signals); };
  hooks.lock_shard_files = [files, options](int shard) {
    return files->Lock(*options, shard);
  };
  absl::StatusOr<std::unique_ptr<ReplicaGroup>> joined =
      SetUpReplica(flags, options, temp_dir, std::move(hooks), port);
  if (joined.ok()) {
    *group = *std::move(joined);
    return -1;
  }
  if (!temp_dir->empty()) std::filesystem::remove_all(*temp_dir);
  if (absl::IsCancelled(joined.status())) {
    options->logger->info("{}; it held no state",
                          std::string(joined.status().message()));
    return 0;
  }
  return Fail(absl::StrCat("cannot join the shard group: ",
                           joined.status().ToString()));
}

// The name, usage and exit statuses --help shows.
ProgramInfo ServerProgram() {
  ProgramInfo program;
  program.name = "ps_server";
  program.version = kVersion;
  program.flags_only = true;
  program.usage =
      "ps_server: one shard of an asyncps parameter-server cluster.\n\n"
      "  ps_server --shard_index=0 --num_shards=2 --port=7000 "
      "[--consistency=ssp ...]\n\n"
      "Exit status: 0 after a clean shutdown (SIGINT/SIGTERM), 1 when the\n"
      "checkpoint cannot be restored or the final one written, 2 for bad\n"
      "flags, a --checkpoint_dir holding files of another shard count or\n"
      "run, or another start failure.";
  return program;
}

int Main(int argc, char** argv) {
  const ParseResult parsed =
      ParseProgramCommandLine(argc, argv, ServerProgram());
  if (!parsed.command_line.has_value()) return parsed.exit_code;
  absl::StatusOr<PsServerOptions> options = OptionsFromFlags();
  if (!options.ok()) return Fail(std::string(options.status().message()));
  for (const std::string& w : parsed.command_line->warnings) {
    options->logger->warn("{}", w);
  }
  // gRPC's own lines (e.g. a refused TLS handshake) go through our logger.
  RouteGrpcLogs(options->logger, spdlog::level::warn);
  RpcMetrics rpc_metrics;
  AuthRefusals auth_refusals(options->logger);
  options->rpc_metrics = &rpc_metrics;
  // The POSIX file system: every read and write of --checkpoint_dir.
  options->fs = FileSystem::Default();
  options->security.on_token_refused = [&auth_refusals](bool missing) {
    auth_refusals.Record(missing);
  };
  const sigset_t signals = BlockStopSignals();
  TuneProcess();
  GuardDescriptors(*options->logger);
  absl::StatusOr<int64_t> unfinished =
      UnfinishedBudget(options->max_message_bytes);
  if (!unfinished.ok()) return Fail(std::string(unfinished.status().message()));

  absl::StatusOr<ReplicaFlags> replica_flags = ReplicaFlagsFromFlags(*options);
  if (!replica_flags.ok()) {
    return Fail(std::string(replica_flags.status().message()));
  }
  auto logger = options->logger;
  // Files this shard must not use are a configuration error (exit 2),
  // before anything is read. A spare of any shard restores only the
  // snapshot it is sent: files of another shard count are all it can mix.
  const bool any = options->store.shard_index == kAnyShard;
  if (absl::Status dir = CheckCheckpointDir(
          {options->checkpoint_dir, any ? 0 : options->store.shard_index,
           options->store.num_shards, options->run_id, options->adopt_run,
           options->restore && !any, options->fs});
      !dir.ok()) {
    return Fail(std::string(dir.message()));
  }
  // The health listener starts before the restore and answers NOT_SERVING
  // until the shard serves, so that a probe sees a shard that is restoring
  // (a startup probe can wait for it) rather than nothing at all.
  absl::StatusOr<std::unique_ptr<HealthListener>> health = StartHealth(*logger);
  if (!health.ok()) return Fail(std::string(health.status().message()));
  std::string temp_dir;
  std::unique_ptr<ReplicaGroup> group;
  ReservedPort advertised_port;
  // A spare of any shard locks the files of the shard it chose.
  ShardFilesLock files;
  if (!any) {
    const absl::Status locked =
        files.Lock(*options, options->store.shard_index);
    if (!locked.ok()) return Fail(std::string(locked.message()));
  }
  if (int exit = JoinGroup(*replica_flags, signals, &*options, &temp_dir,
                           &group, &advertised_port, &files);
      exit >= 0) {
    return exit;
  }
  advertised_port.Release();  // the server binds it next
  const bool restore = options->restore;
  const bool tls = !options->security.tls_cert.empty();
  absl::StatusOr<std::unique_ptr<PsServer>> server =
      PsServer::Start(*std::move(options));
  if (!server.ok()) return StartFailure(server.status(), restore);
  GuardUnfinishedRequests((*server)->port(), *unfinished, tls);
  if (group != nullptr) group->Run(server->get());
  if (*health != nullptr) (*health)->SetServing(true);

  // The metrics endpoint starts after the gRPC server and stops before it.
  const std::string shard_label =
      absl::StrCat("shard=\"", (*server)->GetStatus().shard_index(), "\"");
  MetricsHttpServer metrics(
      [shard = server->get()] { return shard->GetStatus(); },
      [&rpc_metrics, &auth_refusals, shard_label] {
        return ProcessMetrics(rpc_metrics, auth_refusals, shard_label);
      });
  if (absl::Status m = StartMetrics(&metrics, *logger); !m.ok()) {
    return Fail(std::string(m.message()));
  }
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) {
    absl::Status written = WritePortFile(port_file, (*server)->port());
    if (!written.ok())
      return Fail(absl::StrCat("--port_file: ", written.message()));
  }
  const int status = ServeUntilSignal(signals, server->get(), health->get(),
                                      &metrics, group.get(), *logger);
  server->reset();
  group.reset();  // revokes the lease: the others see this process gone
  if (!temp_dir.empty()) std::filesystem::remove_all(temp_dir);
  if (status >= 0) return status;
  // Starts over with the same flags: a fresh process that joins as a spare.
  execv("/proc/self/exe", argv);
  std::perror("ps_server: cannot start over (execv)");
  return 1;
}

}  // namespace
}  // namespace asyncps

int main(int argc, char** argv) { return asyncps::Main(argc, argv); }
