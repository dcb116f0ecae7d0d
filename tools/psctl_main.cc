// psctl: operator's view of an asyncps cluster.
//
//   psctl status     --servers=h:p,h:p [-o table|wide|json|yaml] [--watch=2s]
//                    [--digests]
//   psctl tensors    --servers=h:p,h:p [-o table|wide|json|yaml]
//   psctl checkpoint --servers=h:p,h:p [-o table|json|yaml] [--timeout=60s]
//   psctl health     --servers=h:p,h:p [--service=NAME] [-o ...]
//   psctl rebalance  --servers=h:p,h:p (--out=MAP_FILE | --apply)
//                    [--threshold=1.05] [--watch=60s (with --apply)]
//   psctl move       --servers=h:p,h:p --slot_list=3,7,10-20 --to_shard=K
//   psctl adopt      --servers=h:p,h:p [--remake_lost]
//   psctl scale      --servers=h:p,h:p --shards=M
//   psctl scale      --servers=h:p,h:p --watch=5s   # grows onto new ones
//   psctl reshard    --from=DIR --to=NEW_DIR --shards=M [--slots=S |
//                    --map=MAP_FILE] [-o table|json|yaml]
// --servers may come from ASYNCPS_SERVERS (as every flag from
// ASYNCPS_<FLAG>). In a replicated run, --etcd_endpoints (and --run_id)
// instead of --servers asks each shard's primary as the run's shard map in
// etcd names it. Against a secured cluster add --tls_ca (and
// --tls_cert/--tls_key for mutual TLS) and --cluster_token_file, as for
// ps_worker.
//
// `status` asks every shard for its Status concurrently and prints a cluster
// summary, one row per shard (a shard that does not answer is a DOWN row with
// the error) and one row per worker merged across shards; a shard in the
// wrong place of --servers is named in a WARNING line. `tensors` lists the
// tensors and sparse tables the shards hold. `checkpoint` makes every shard
// write its checkpoint (ps_server --checkpoint_dir), all at once, and prints
// one row per shard: the file, its size and how long the write took. `health`
// asks the standard health service (usable as a Kubernetes exec probe).
// `rebalance` plans a slotted run's new map from its shards' per-slot load
// (and with --apply moves the slots there while the run trains); `move`
// moves the given slots to one shard while the run trains, `adopt` hands
// every shard the newest map the shards serve (tools/live_moves.h), and
// `scale` spreads the slots over the first M shard processes, live, so
// that the others own none and may be stopped (tools/scale_plan.h), or
// with --watch grows the run onto the processes that come up;
// `reshard` works on files, not on shards: it rewrites the checkpoints of a
// stopped cluster of N shards into those of M shards, or of another map
// (tools/map_commands.h).
//
// A shard that cannot be reached is probed once more to name the cause
// (common/connection_check.h): nothing listening, TLS against plain TCP,
// certificates.
//
// Exit status: 0 when every shard answered (status: or owns no slot of a
// slotted run, drained or standing by; checkpoint: wrote its
// checkpoint; health: SERVING) and none is misplaced, 1 otherwise, 2 on bad
// flags or usage (the message names the flag).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/cli.h"
#include "common/connection_check.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/security.h"
#include "common/security_flags.h"
#include "common/version.h"
#include "membership/etcd_flags.h"
#include "membership/shard_addressing.h"
#include "tools/doc.h"
#include "tools/etcd_status_view.h"
#include "tools/live_moves.h"
#include "tools/map_commands.h"
#include "tools/map_record_view.h"
#include "tools/psctl_output.h"
#include "tools/replica_digests.h"
#include "tools/shard_query.h"
#include "tools/status_table.h"
#include "tools/tensor_listing.h"

ABSL_FLAG(std::string, servers, "",
          "Comma-separated host:port of every shard, in shard order; an "
          "address with {i} stands for --num_shards addresses, {i} = 0 .. "
          "num_shards-1.");
ABSL_FLAG(int, num_shards, 0,
          "The shard count: needed by an address with {i} in --servers; when "
          "> 0, --servers must list exactly this many shards.");
ABSL_FLAG(std::string, run_id, "",
          "With --etcd_endpoints: the run whose shard map to read.");
ABSL_FLAG(std::string, output, "table",
          "Output format (also -o): table, wide (more columns), json or "
          "yaml.");
ABSL_FLAG(bool, json, false, "Same as -o json (kept for scripts).");
ABSL_FLAG(absl::Duration, watch, absl::ZeroDuration(),
          "status only: refresh every this long (e.g. 2s) until SIGINT; 0 = "
          "print once.");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(3),
          "Deadline of each call to a shard (checkpoint: 60s unless given).");
ABSL_FLAG(std::string, from, "",
          "reshard only: the checkpoint directory of the stopped cluster.");
ABSL_FLAG(std::string, to, "",
          "reshard only: the new directory for the resharded files (must not "
          "hold shard files).");
ABSL_FLAG(int, shards, 0,
          "reshard: the new shard count; scale: the shard processes that "
          "own the slots (shards 0..M-1).");
ABSL_FLAG(int, slots, 0,
          "reshard only: the new files' map has this many slots, spread "
          "evenly (0 = the static map).");
ABSL_FLAG(std::string, map, "",
          "reshard only: a shard map file (psctl rebalance --out) the new "
          "files follow; its shard count must be --shards.");
ABSL_FLAG(std::string, out, "",
          "rebalance only: the file the planned shard map is written to.");
ABSL_FLAG(bool, apply, false,
          "rebalance only: move the slots to the planned map now, while the "
          "run trains (live moves), instead of only writing it.");
ABSL_FLAG(std::string, slot_list, "",
          "move only: the slots to move, e.g. 3,7,10-20.");
ABSL_FLAG(int, to_shard, -1, "move only: the shard the slots move to.");
ABSL_FLAG(double, threshold, 1.05,
          "rebalance only: move slots until the busiest shard carries at "
          "most this times the mean load.");
ABSL_FLAG(std::string, by, "bytes",
          "rebalance only: the load to even out: bytes (gradient bytes "
          "pushed), updates (slices and rows updated) or rows (rows "
          "pushed).");
ABSL_FLAG(bool, digests, false,
          "status only: also the state digest of every replica of a "
          "replicated run (primaries and their backups, each asked; replicas "
          "at one log entry must agree).");
ABSL_FLAG(bool, remake_lost, false,
          "adopt only: a shard may also take slots the map gives it whose "
          "state it does not hold (it came back on files from before a move "
          "into it, in a run without etcd): their slices are made anew as at "
          "creation and their updates are lost; the shard counts them "
          "(psctl status warns).");
ABSL_FLAG(std::string, service, "",
          "health only: the service to ask about; empty = the server as a "
          "whole (asyncps.ParameterServer works as well).");

namespace asyncps {
namespace {

constexpr char kUsage[] =
    "psctl: inspects an asyncps cluster.\n\n"
    "  psctl status     --servers=h:p,h:p [-o table|wide|json|yaml] "
    "[--watch=2s] [--digests]\n"
    "  psctl tensors    --servers=h:p,h:p [-o table|wide|json|yaml]\n"
    "  psctl checkpoint --servers=h:p,h:p [-o table|json|yaml] "
    "[--timeout=60s]\n"
    "  psctl health     --servers=h:p,h:p [--service=NAME]\n"
    "  psctl rebalance  --servers=h:p,h:p (--out=MAP_FILE | --apply) "
    "[--threshold=1.05] [--by=bytes] [--watch=60s]\n"
    "  psctl move       --servers=h:p,h:p --slot_list=3,7,10-20 "
    "--to_shard=K\n"
    "  psctl adopt      --servers=h:p,h:p [--remake_lost]\n"
    "  psctl scale      --servers=h:p,h:p --shards=M\n"
    "  psctl scale      --servers=h:p,h:p --watch=5s  (grows the run onto "
    "the shards that come up)\n"
    "  psctl reshard    --from=DIR --to=NEW_DIR --shards=M [--slots=S | "
    "--map=MAP_FILE]\n\n"
    "--servers may also come from ASYNCPS_SERVERS; in a replicated run,\n"
    "--etcd_endpoints=h:p --run_id=R finds the shards' primaries instead.\n"
    "Exit status: 0 every shard answered (checkpoint: wrote one; health:\n"
    "SERVING; reshard: the files were written) and sits at its place in\n"
    "--servers, 1 otherwise, 2 bad usage.";

constexpr absl::Duration kCheckpointTimeout = absl::Seconds(60);
constexpr absl::Duration kMoveTimeout = absl::Minutes(10);

std::string LocalTime() {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::Now(),
                          absl::LocalTimeZone());
}

// Replaces a bare UNAVAILABLE error (e.g. "Socket closed") with the cause
// a second, plain connection attempt shows.
void Explain(const std::string& address, const SecurityOptions& security,
             std::string* error) {
  if (address.empty()) {  // with --etcd_endpoints
    *error =
        "UNAVAILABLE: the run's shard map names no primary for this shard "
        "now (a failover under way, or every replica gone)";
    return;
  }
  if (!absl::StartsWith(*error, "UNAVAILABLE")) return;
  const std::string cause = DiagnoseConnection(address, security);
  if (!cause.empty()) *error = absl::StrCat("UNAVAILABLE: ", cause);
}

// psctl's context: the shards and how to reach them.
struct Cluster {
  ShardQuery* query;
  SecurityOptions security;
  absl::Duration timeout;
  Format format;
  // With --etcd_endpoints: the shard map, whose primaries status --watch
  // follows. Null otherwise.
  const MapRouter* router = nullptr;
  // With --etcd_endpoints: the client the router reads through (the run's
  // map record lives there too). Null otherwise.
  EtcdClient* etcd = nullptr;
};

// Asks the primaries the router names now, when they moved since the last
// call (*seen: the router's generation then); else `query` as it is.
ShardQuery* Follow(const Cluster& c, uint64_t* seen,
                   std::unique_ptr<ShardQuery>* followed) {
  if (c.router == nullptr || c.router->generation() == *seen) {
    return *followed != nullptr ? followed->get() : c.query;
  }
  *seen = c.router->generation();
  std::vector<std::string> addresses;
  for (int s = 0; s < c.router->num_shards(); ++s) {
    addresses.push_back(c.router->Address(s));
  }
  *followed = std::make_unique<ShardQuery>(std::move(addresses), c.security);
  return followed->get();
}

int RunStatus(const Cluster& c, absl::Duration watch, bool digests) {
  // SIGINT ends --watch: it is blocked here (before gRPC starts threads that
  // would inherit the mask) and taken by sigtimedwait between refreshes.
  sigset_t sigint;
  sigemptyset(&sigint);
  sigaddset(&sigint, SIGINT);
  sigaddset(&sigint, SIGTERM);
  const bool watching = watch > absl::ZeroDuration();
  if (watching) pthread_sigmask(SIG_BLOCK, &sigint, nullptr);
  const bool text = c.format == Format::kTable || c.format == Format::kWide;
  const bool clear = watching && text && isatty(1);
  int code = 0;
  uint64_t seen = c.router != nullptr ? c.router->generation() : 0;
  std::unique_ptr<ShardQuery> followed;  // once a primary moved
  while (true) {
    StatusRequest request;
    request.set_state_digest(digests);
    std::vector<ShardResult> results =
        Follow(c, &seen, &followed)->Status(c.timeout, request);
    code = 0;
    const std::vector<bool> owns_none = OwningNoSlot(results);
    for (size_t i = 0; i < results.size(); ++i) {
      ShardResult& r = results[i];
      if (r.up) continue;
      if (owns_none[i]) {  // drained, standing by, or no process yet
        r.error = absl::StrCat("owns no slot (psctl scale): ", r.error);
        continue;
      }
      code = kExitDown;
      Explain(r.address, c.security, &r.error);
    }
    if (!Problems(results).empty()) code = kExitDown;
    const MapRecordView record =
        ReadMapRecordView(results, c.etcd, c.security, c.timeout);
    const EtcdStatusView etcd = ReadEtcdStatus(c.etcd, c.router);
    if (AlarmRaised(etcd)) code = kExitDown;
    std::string out;
    Doc doc = text ? Doc::Null() : StatusDoc(results);
    if (!text) doc.Set("map_record", MapRecordDoc(record));
    if (!text) AddEtcdStatusDoc(etcd, &doc);
    if (digests) {
      const std::vector<ReplicaDigest> d =
          GatherDigests(results, c.security, c.timeout);
      if (!DigestProblems(d).empty()) code = kExitDown;
      out = text ? absl::StrCat(RenderText(results, c.format == Format::kWide),
                                MapRecordText(record), EtcdStatusText(etcd),
                                DigestsText(d))
                 : Render(doc.Set("digests", DigestsDoc(d)), c.format);
    } else {
      out = text ? absl::StrCat(RenderText(results, c.format == Format::kWide),
                                MapRecordText(record), EtcdStatusText(etcd))
                 : Render(doc, c.format);
    }
    if (watching && text) {
      out = absl::StrCat(clear ? "\033[H\033[2J" : "", LocalTime(), "  (every ",
                         absl::FormatDuration(watch), ", Ctrl-C to stop)\n",
                         out, clear ? "" : "\n");
    } else if (watching && c.format == Format::kYaml) {
      out = absl::StrCat("---\n", out);  // a stream of YAML documents
    }
    Print(out);
    if (!watching) break;
    const timespec wait = absl::ToTimespec(watch);
    siginfo_t info;
    const int sig = sigtimedwait(&sigint, &info, &wait);
    if (sig == SIGINT || sig == SIGTERM) break;
  }
  return code;
}

int RunTensors(const Cluster& c) {
  std::vector<TensorListResult> results = c.query->ListTensors(c.timeout);
  for (TensorListResult& r : results) {
    if (!r.up) Explain(r.address, c.security, &r.error);
  }
  return PrintTensors(results, c.format);
}

int RunCheckpoint(const Cluster& c) {
  std::vector<CheckpointResult> results = c.query->Checkpoint(c.timeout);
  int code = 0;
  int written = 0;
  for (CheckpointResult& r : results) {
    if (r.ok) {
      ++written;
    } else {
      code = kExitDown;
      Explain(r.address, c.security, &r.error);
    }
  }
  if (c.format == Format::kJson || c.format == Format::kYaml) {
    Doc shards = Doc::Array();
    for (const CheckpointResult& r : results) {
      Doc row = Doc::Object();
      row.Set("index", Doc::Int(r.index))
          .Set("address", Doc::String(r.address))
          .Set("ok", Doc::Bool(r.ok));
      if (r.ok) {
        row.Merge(DocFromMessage(r.checkpoint));
      } else {
        row.Set("error", Doc::String(r.error));
      }
      shards.Add(std::move(row));
    }
    Doc doc = Doc::Object();
    doc.Set("shards", std::move(shards));
    Print(Render(doc, c.format));
    return code;
  }
  std::string out = absl::StrCat(written, "/", results.size(),
                                 " shards wrote a checkpoint\n");
  TextTable table({"SHARD", "ADDRESS", "STATE", "BYTES", "MS", "PATH"},
                  /*left_columns=*/3);
  for (const CheckpointResult& r : results) {
    if (r.ok) {
      table.AddRow({absl::StrCat(r.index), r.address, "OK",
                    absl::StrCat(r.checkpoint.bytes()),
                    absl::StrFormat("%.1f", r.checkpoint.duration_ms()),
                    r.checkpoint.path()});
    } else {
      table.AddRow({absl::StrCat(r.index), r.address, "FAILED", r.error});
    }
  }
  absl::StrAppend(&out, table.Render());
  Print(out);
  return code;
}

int RunHealth(const Cluster& c, const std::string& service) {
  std::vector<HealthResult> results = c.query->Health(c.timeout, service);
  int code = 0;
  for (HealthResult& r : results) {
    if (!r.answered) Explain(r.address, c.security, &r.error);
    if (!r.answered || r.status != "SERVING") code = kExitDown;
  }
  if (c.format == Format::kJson || c.format == Format::kYaml) {
    Doc shards = Doc::Array();
    for (const HealthResult& r : results) {
      Doc row = Doc::Object();
      row.Set("index", Doc::Int(r.index))
          .Set("address", Doc::String(r.address))
          .Set("service", Doc::String(service));
      if (r.answered) {
        row.Set("status", Doc::String(r.status));
      } else {
        row.Set("status", Doc::Null()).Set("error", Doc::String(r.error));
      }
      shards.Add(std::move(row));
    }
    Doc doc = Doc::Object();
    doc.Set("shards", std::move(shards));
    Print(Render(doc, c.format));
    return code;
  }
  TextTable table({"SHARD", "ADDRESS", "STATUS"}, /*left_columns=*/3);
  for (const HealthResult& r : results) {
    table.AddRow({absl::StrCat(r.index), r.address,
                  r.answered ? r.status : absl::StrCat("DOWN  ", r.error)});
  }
  Print(table.Render());
  return code;
}

// The one command of the command line; INVALID_ARGUMENT (the usage error)
// for none, several or an unknown one.
absl::StatusOr<std::string> CommandOf(const ParsedCommandLine& cl) {
  if (cl.positional.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected one command (status, tensors, checkpoint, health, "
        "rebalance, move, adopt, scale or reshard), got ",
        cl.positional.size(), " (see psctl --help)"));
  }
  const std::string command = cl.positional[0];
  if (command != "status" && command != "tensors" && command != "checkpoint" &&
      command != "health" && command != "rebalance" && command != "move" &&
      command != "adopt" && command != "scale" && command != "reshard") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown command '", command,
                     "' (expected status, tensors, checkpoint, health, "
                     "rebalance, move, adopt, scale or reshard)"));
  }
  return command;
}

// --from, --to, --shards, --slots and --map belong to reshard (--shards
// also to scale), --out,
// --threshold, --by and --apply to rebalance, --slot_list and --to_shard
// to move: given on the command line to another
// command they are a usage error; set from the environment (ASYNCPS_SHARDS
// is also the Slurm script's shard count), a warning.
absl::Status CheckCommandFlags(const ParsedCommandLine& cl,
                               const std::string& command) {
  const std::pair<const char*, const char*> owned[] = {
      {"from", "reshard"},
      {"to", "reshard"},
      {"shards", "reshard or scale"},
      {"slots", "reshard"},
      {"map", "reshard"},
      {"out", "rebalance"},
      {"threshold", "rebalance"},
      {"by", "rebalance"},
      {"apply", "rebalance"},
      {"slot_list", "move"},
      {"to_shard", "move"}};
  for (const auto& [flag, owner] : owned) {
    const std::vector<std::string> owners = absl::StrSplit(owner, " or ");
    if (!cl.IsSet(flag) || absl::c_linear_search(owners, command)) continue;
    const std::string& by = cl.set_by.at(flag);
    if (by.rfind("--", 0) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, " applies only to the ", owner, " command"));
    }
    std::fprintf(stderr,
                 "psctl: warning: %s sets --%s, which only the %s command "
                 "uses; ignored\n",
                 by.c_str(), flag, owner);
  }
  return absl::OkStatus();
}

// --output (-o), or --json.
absl::StatusOr<Format> FormatFromFlags(const ParsedCommandLine& cl) {
  Format format = Format::kTable;
  const std::string output = absl::GetFlag(FLAGS_output);
  if (output == "table") {
    format = Format::kTable;
  } else if (output == "wide") {
    format = Format::kWide;
  } else if (output == "json") {
    format = Format::kJson;
  } else if (output == "yaml") {
    format = Format::kYaml;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--output (-o) must be table, wide, json or yaml, got '", output, "'"));
  }
  if (absl::GetFlag(FLAGS_json)) {
    if (cl.IsSet("output") && format != Format::kJson) {
      return absl::InvalidArgumentError("--json contradicts --output=" +
                                        output);
    }
    format = Format::kJson;
  }
  return format;
}

// How a command that asks the shards reaches them.
struct Connection {
  std::vector<std::string> servers;
  std::shared_ptr<MapRouter> router;  // with --etcd_endpoints
  SecurityOptions security;
  absl::Duration timeout;  // of each call
  absl::Duration watch;    // status --watch; zero = once
};

// The flags of the commands that ask the shards; the security warnings are
// printed. INVALID_ARGUMENT (the usage error) for a bad or misplaced flag.
absl::StatusOr<Connection> ConnectionFromFlags(const ParsedCommandLine& cl,
                                               const std::string& command) {
  Connection c;
  c.timeout = command == "checkpoint" && !cl.IsSet("timeout")
                  ? kCheckpointTimeout
                  : absl::GetFlag(FLAGS_timeout);
  if (c.timeout <= absl::ZeroDuration() ||
      c.timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout must be > 0 and finite, got ",
                     absl::FormatDuration(c.timeout)));
  }
  ShardAddressingOptions a{absl::GetFlag(FLAGS_servers),
                           absl::GetFlag(FLAGS_num_shards), "",
                           absl::GetFlag(FLAGS_run_id)};
  a.router.wait_for_map = c.timeout;  // the shards write it: no waiting here
  a.router.etcd_call_timeout = c.timeout;
  std::vector<std::string> warnings;  // printed below
  if (absl::Status s = AddEtcdFlags(&a, &warnings); !s.ok()) return s;
  absl::StatusOr<ShardAddressing> shards = ResolveShardAddressing(a);
  if (!shards.ok()) {  // etcd not answering too: the flags are what to fix
    return absl::InvalidArgumentError(shards.status().message());
  }
  c.servers = std::move(shards->servers);
  c.router = std::move(shards->router);
  c.watch = absl::GetFlag(FLAGS_watch);
  if (c.watch < absl::ZeroDuration() || c.watch == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--watch must be >= 0 and finite, got ",
                     absl::FormatDuration(c.watch)));
  }
  if (c.watch > absl::ZeroDuration() && command != "status" &&
      command != "scale" &&
      !(command == "rebalance" && absl::GetFlag(FLAGS_apply))) {
    return absl::InvalidArgumentError(
        "--watch applies only to the status command, scale and rebalance "
        "--apply");
  }
  if (cl.IsSet("digests") && command != "status") {
    return absl::InvalidArgumentError(
        "--digests applies only to the status command");
  }
  if (cl.IsSet("remake_lost") && command != "adopt") {
    return absl::InvalidArgumentError(
        "--remake_lost applies only to the adopt command");
  }
  if (cl.IsSet("service") && command != "health") {
    return absl::InvalidArgumentError(
        "--service applies only to the health command");
  }
  absl::StatusOr<SecurityOptions> security =
      SecurityOptionsFromFlags(/*server=*/false, &warnings);
  if (!security.ok()) return security.status();
  c.security = *std::move(security);
  const std::string own = CheckOwnCertificate(c.security);
  if (!own.empty()) warnings.push_back(own);
  for (const std::string& w : warnings) {
    std::fprintf(stderr, "psctl: warning: %s\n", w.c_str());
  }
  return c;
}

int Main(int argc, char** argv) {
  TuneProcess();
  ProgramInfo program;
  program.name = "psctl";
  program.version = kVersion;
  program.usage = kUsage;
  program.short_aliases = {{"o", "output"}};
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "help") {
      Print(HelpText(program, "", false));
      return 0;
    }
  }
  const ParseResult parsed = ParseProgramCommandLine(argc, argv, program);
  if (!parsed.command_line.has_value()) return parsed.exit_code;
  const ParsedCommandLine& cl = *parsed.command_line;
  for (const std::string& w : cl.warnings) {
    std::fprintf(stderr, "psctl: warning: %s\n", w.c_str());
  }
  const absl::StatusOr<std::string> command = CommandOf(cl);
  if (!command.ok()) return UsageError(std::string(command.status().message()));
  if (absl::Status s = CheckCommandFlags(cl, *command); !s.ok()) {
    return UsageError(std::string(s.message()));
  }
  // gRPC's own log lines (e.g. its TLS handshake errors) would come before
  // psctl's explanation; psctl says what failed itself.
  RouteGrpcLogs(nullptr, spdlog::level::off);
  const absl::StatusOr<Format> format = FormatFromFlags(cl);
  if (!format.ok()) return UsageError(std::string(format.status().message()));
  if (*command == "reshard") {
    if (*format == Format::kWide) {
      return UsageError("reshard prints table, json or yaml");
    }
    return RunReshard({absl::GetFlag(FLAGS_from), absl::GetFlag(FLAGS_to),
                       absl::GetFlag(FLAGS_shards), absl::GetFlag(FLAGS_slots),
                       absl::GetFlag(FLAGS_map)},
                      *format);
  }
  if (((*command == "rebalance" && absl::GetFlag(FLAGS_apply)) ||
       *command == "scale") &&
      absl::GetFlag(FLAGS_watch) > absl::ZeroDuration()) {
    // The automatic mode ends on SIGINT/SIGTERM, taken between rounds: they
    // are blocked before any thread starts (every thread inherits the mask).
    BlockStopSignals();
  }
  absl::StatusOr<Connection> c = ConnectionFromFlags(cl, *command);
  if (!c.ok()) return UsageError(std::string(c.status().message()));

  const std::vector<std::string> servers = c->servers;
  ShardQuery query(std::move(c->servers), c->security);
  const Cluster cluster{
      &query,          c->security,
      c->timeout,      *format,
      c->router.get(), c->router != nullptr ? c->router->etcd() : nullptr};
  if (*command == "checkpoint") return RunCheckpoint(cluster);
  // A move runs as long as it copies: --timeout bounds each move, at least
  // kMoveTimeout.
  const LiveMoveOptions live{servers, c->security,
                             std::max(c->timeout, kMoveTimeout), *format,
                             absl::GetFlag(FLAGS_remake_lost)};
  if (*command == "rebalance") {
    RebalanceFlags f;
    f.out = absl::GetFlag(FLAGS_out);
    f.threshold = absl::GetFlag(FLAGS_threshold);
    f.by = absl::GetFlag(FLAGS_by);
    f.apply = absl::GetFlag(FLAGS_apply);
    if (c->watch > absl::ZeroDuration()) {
      return RunRebalanceEvery(&query, c->timeout, f, live, c->watch);
    }
    return RunRebalance(&query, c->timeout, f, live);
  }
  if (*command == "adopt") return RunAdoptNewest(&query, c->timeout, live);
  if (*command == "scale") {
    if (c->watch > absl::ZeroDuration()) {
      if (cl.IsSet("shards")) {
        return UsageError(
            "scale --watch follows the shards that come up; it takes no "
            "--shards");
      }
      return RunScaleFollow(&query, c->timeout, live, c->watch);
    }
    return RunScale(&query, c->timeout, absl::GetFlag(FLAGS_shards), live);
  }
  if (*command == "move") {
    return RunMove(&query, c->timeout, absl::GetFlag(FLAGS_slot_list),
                   absl::GetFlag(FLAGS_to_shard), live);
  }
  if (*command == "health") {
    return RunHealth(cluster, absl::GetFlag(FLAGS_service));
  }
  return *command == "status"
             ? RunStatus(cluster, c->watch, absl::GetFlag(FLAGS_digests))
             : RunTensors(cluster);
}

}  // namespace
}  // namespace asyncps

int main(int argc, char** argv) {
  return asyncps::OutputWritten(asyncps::Main(argc, argv));
}
