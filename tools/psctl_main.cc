// psctl: operator's view of an asyncps cluster.
//
//   psctl status  --servers=h:p,h:p [--json] [--watch=2s] [--timeout=3s]
//   psctl tensors --servers=h:p,h:p [--json] [--timeout=3s]
//   psctl checkpoint --servers=h:p,h:p [--json] [--timeout=60s]
// Against a secured cluster add --tls_ca (and --tls_cert/--tls_key for
// mutual TLS) and --cluster_token_file, as for ps_worker.
//
// `status` asks every shard for its Status concurrently and prints a cluster
// summary, one row per shard (a shard that does not answer is a DOWN row with
// the error) and one row per worker merged across shards. `tensors` lists the
// tensors the shards hold. `checkpoint` makes every shard write its
// checkpoint (ps_server --checkpoint_dir), all at once, and prints one row
// per shard: the file, its size and how long the write took.
//
// Exit status: 0 when every shard answered (checkpoint: wrote its
// checkpoint), 1 when any did not, 2 on bad flags or usage (the message
// names the flag).
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <ctime>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/net.h"
#include "common/security.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "tools/shard_query.h"
#include "tools/status_table.h"

ABSL_FLAG(std::string, servers, "",
          "Comma-separated host:port of every shard, in shard order.");
ABSL_FLAG(bool, json, false, "Print one JSON document instead of tables.");
ABSL_FLAG(absl::Duration, watch, absl::ZeroDuration(),
          "status only: refresh every this long (e.g. 2s) until SIGINT; 0 = "
          "print once.");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(3),
          "Deadline of each call to a shard (checkpoint: 60s unless given).");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate for mutual TLS (with --tls_key).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle the shards' certificates are verified with; turns "
          "on TLS.");
ABSL_FLAG(bool, tls_require_client_cert, false,
          "ps_server only; rejected here (exit 2).");
ABSL_FLAG(std::string, cluster_token_file, "",
          "File holding the shared cluster token, sent with every call.");

namespace asyncps {
namespace {

constexpr int kExitDown = 1;
constexpr int kExitUsage = 2;

constexpr char kUsage[] =
    "Inspects an asyncps cluster.\n"
    "  psctl status  --servers=h:p,h:p [--json] [--watch=2s] [--timeout=3s]\n"
    "  psctl tensors --servers=h:p,h:p [--json] [--timeout=3s]\n"
    "  psctl checkpoint --servers=h:p,h:p [--json] [--timeout=60s]\n"
    "Exit status: 0 all shards answered (checkpoint: all wrote one), 1 some\n"
    "shard is down (or failed to write), 2 bad usage.\n";

constexpr absl::Duration kCheckpointTimeout = absl::Seconds(60);

int UsageError(const std::string& message) {
  std::fprintf(stderr, "psctl: %s\n", message.c_str());
  return kExitUsage;
}

// absl::ParseCommandLine exits with status 1 on an unknown flag or a bad
// value, which psctl reserves for "a shard is down"; so every flag argument
// is checked here first, and the error names it.
// Adds the name of every flag given to *given.
absl::Status CheckFlagArguments(int argc, char** argv,
                                std::set<std::string>* given) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    arg.remove_prefix(arg[1] == '-' ? 2 : 1);
    const size_t eq = arg.find('=');
    const absl::string_view name = arg.substr(0, eq);
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    bool negated = false;
    if (flag == nullptr && absl::StartsWith(name, "no")) {
      flag = absl::FindCommandLineFlag(name.substr(2));
      negated = flag != nullptr && flag->IsOfType<bool>();
      if (!negated) flag = nullptr;
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    std::string value;
    if (negated) {
      if (eq != absl::string_view::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " takes no value"));
      }
      value = "false";
    } else if (eq != absl::string_view::npos) {
      value = std::string(arg.substr(eq + 1));
    } else if (flag->IsOfType<bool>()) {
      value = "true";
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("flag --", name, " needs a value"));
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag->Name(), ": ", error));
    }
    given->insert(std::string(flag->Name()));
  }
  return absl::OkStatus();
}

// The security flags as options; the error names the flag.
absl::StatusOr<SecurityOptions> SecurityFromFlags() {
  SecurityFlagValues v;
  v.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  v.tls_key = absl::GetFlag(FLAGS_tls_key);
  v.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  v.tls_require_client_cert = absl::GetFlag(FLAGS_tls_require_client_cert);
  v.cluster_token_file = absl::GetFlag(FLAGS_cluster_token_file);
  return SecurityOptionsFromFlagValues(v, /*server=*/false);
}

std::string LocalTime() {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::Now(),
                          absl::LocalTimeZone());
}

int RunStatus(ShardQuery& query, absl::Duration timeout, absl::Duration watch,
              bool json) {
  // SIGINT ends --watch: it is blocked here (before gRPC starts threads that
  // would inherit the mask) and taken by sigtimedwait between refreshes.
  sigset_t sigint;
  sigemptyset(&sigint);
  sigaddset(&sigint, SIGINT);
  sigaddset(&sigint, SIGTERM);
  if (watch > absl::ZeroDuration()) {
    pthread_sigmask(SIG_BLOCK, &sigint, nullptr);
  }
  const bool clear = watch > absl::ZeroDuration() && !json && isatty(1);
  int code = 0;
  while (true) {
    const std::vector<ShardResult> results = query.Status(timeout);
    code = 0;
    for (const ShardResult& r : results) {
      if (!r.up) code = kExitDown;
    }
    std::string out = json ? RenderJson(results) : RenderText(results);
    if (watch > absl::ZeroDuration() && !json) {
      out = absl::StrCat(clear ? "\033[H\033[2J" : "", LocalTime(), "  (every ",
                         absl::FormatDuration(watch), ", Ctrl-C to stop)\n",
                         out, clear ? "" : "\n");
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
    if (watch <= absl::ZeroDuration()) break;
    const timespec wait = absl::ToTimespec(watch);
    siginfo_t info;
    const int sig = sigtimedwait(&sigint, &info, &wait);
    if (sig == SIGINT || sig == SIGTERM) break;
  }
  return code;
}

std::string Shape(const TensorSpec& spec) {
  return absl::StrCat("[", absl::StrJoin(spec.shape(), ","), "]");
}

int RunTensors(ShardQuery& query, absl::Duration timeout, bool json) {
  const std::vector<TensorListResult> results = query.ListTensors(timeout);
  int code = 0;
  int up = 0;
  // name -> (spec as first seen, shards listing it, whether any shard's
  // spec differs).
  struct Seen {
    TensorSpec spec;
    int shards = 0;
    bool mismatch = false;
  };
  std::map<std::string, Seen> tensors;
  for (const TensorListResult& r : results) {
    if (!r.up) {
      code = kExitDown;
      continue;
    }
    ++up;
    for (const TensorSpec& spec : r.tensors.tensors()) {
      auto [it, fresh] = tensors.try_emplace(spec.name());
      if (fresh) {
        it->second.spec = spec;
      } else if (!google::protobuf::util::MessageDifferencer::Equals(
                     it->second.spec, spec)) {
        it->second.mismatch = true;
      }
      ++it->second.shards;
    }
  }
  std::string out;
  if (json) {
    google::protobuf::util::JsonPrintOptions options;
    options.preserve_proto_field_names = true;
    options.always_print_primitive_fields = true;
    std::vector<std::string> shards, rows;
    for (const TensorListResult& r : results) {
      shards.push_back(absl::StrCat(
          "{\"index\":", r.index, ",\"address\":", JsonQuote(r.address),
          ",\"up\":", r.up ? "true" : "false",
          r.up ? "" : absl::StrCat(",\"error\":", JsonQuote(r.error)), "}"));
    }
    for (const auto& [name, seen] : tensors) {
      std::string spec;
      if (!google::protobuf::util::MessageToJsonString(seen.spec, &spec,
                                                       options)
               .ok()) {
        spec = "null";
      }
      rows.push_back(absl::StrCat(
          "{\"spec\":", spec, ",\"shards\":", seen.shards,
          ",\"consistent\":", seen.mismatch ? "false" : "true", "}"));
    }
    out = absl::StrCat("{\"shards\":[", absl::StrJoin(shards, ","),
                       "],\"tensors\":[", absl::StrJoin(rows, ","), "]}\n");
  } else {
    absl::StrAppend(&out, up, "/", results.size(), " shards answered\n");
    for (const TensorListResult& r : results) {
      if (!r.up) {
        absl::StrAppend(&out, "  shard ", r.index, " ", r.address, " DOWN  ",
                        r.error, "\n");
      }
    }
    absl::StrAppend(
        &out, absl::StrFormat("%-24s %-16s %12s %11s %-20s %-10s %s\n", "NAME",
                              "SHAPE", "ELEMS", "SLICE_ELEMS", "INIT",
                              "OPTIMIZER", "SHARDS"));
    for (const auto& [name, seen] : tensors) {
      int64_t elems = 1;
      for (int64_t d : seen.spec.shape()) elems *= d;
      absl::StrAppend(
          &out, absl::StrFormat(
                    "%-24s %-16s %12d %11d %-20s %-10s %d/%d%s\n", name,
                    Shape(seen.spec), elems, seen.spec.slice_elems(),
                    Initializer_Name(seen.spec.init()),
                    OptimizerType_Name(seen.spec.optimizer().type()),
                    seen.shards, up, seen.mismatch ? "  SPEC MISMATCH" : ""));
    }
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return code;
}

int RunCheckpoint(ShardQuery& query, absl::Duration timeout, bool json) {
  const std::vector<CheckpointResult> results = query.Checkpoint(timeout);
  int code = 0;
  int written = 0;
  for (const CheckpointResult& r : results) {
    if (r.ok) {
      ++written;
    } else {
      code = kExitDown;
    }
  }
  std::string out;
  if (json) {
    std::vector<std::string> rows;
    for (const CheckpointResult& r : results) {
      std::string row = absl::StrCat("{\"index\":", r.index,
                                     ",\"address\":", JsonQuote(r.address),
                                     ",\"ok\":", r.ok ? "true" : "false");
      if (r.ok) {
        absl::StrAppend(&row, ",\"path\":", JsonQuote(r.checkpoint.path()),
                        ",\"bytes\":", r.checkpoint.bytes(),
                        ",\"duration_ms\":",
                        absl::StrFormat("%.3f", r.checkpoint.duration_ms()),
                        ",\"unix_time_ms\":", r.checkpoint.unix_time_ms(),
                        ",\"tensors\":", r.checkpoint.tensors(),
                        ",\"slices\":", r.checkpoint.slices());
      } else {
        absl::StrAppend(&row, ",\"error\":", JsonQuote(r.error));
      }
      rows.push_back(row + "}");
    }
    out = absl::StrCat("{\"shards\":[", absl::StrJoin(rows, ","), "]}\n");
  } else {
    absl::StrAppend(&out, written, "/", results.size(),
                    " shards wrote a checkpoint\n");
    absl::StrAppend(&out, absl::StrFormat("%-5s %-21s %-6s %14s %10s  %s\n",
                                          "SHARD", "ADDRESS", "STATE", "BYTES",
                                          "MS", "PATH"));
    for (const CheckpointResult& r : results) {
      if (r.ok) {
        absl::StrAppend(
            &out, absl::StrFormat("%-5d %-21s %-6s %14d %10.1f  %s\n", r.index,
                                  r.address, "OK", r.checkpoint.bytes(),
                                  r.checkpoint.duration_ms(),
                                  r.checkpoint.path()));
      } else {
        absl::StrAppend(&out,
                        absl::StrFormat("%-5d %-21s %-6s %14s %10s  %s\n",
                                        r.index, r.address, "FAILED", "-", "-",
                                        r.error));
      }
    }
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return code;
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h" || arg == "help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  std::set<std::string> given;
  const absl::Status flags_ok = CheckFlagArguments(argc, argv, &given);
  if (!flags_ok.ok()) return UsageError(std::string(flags_ok.message()));
  const std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    return UsageError(
        absl::StrCat("expected one command (status, tensors or checkpoint), "
                     "got ",
                     args.size() - 1, "\n", kUsage));
  }
  const std::string command = args[1];
  if (command != "status" && command != "tensors" &&
      command != "checkpoint") {
    return UsageError(
        absl::StrCat("unknown command '", command,
                     "' (expected status, tensors or checkpoint)"));
  }
  const std::string servers_flag = absl::GetFlag(FLAGS_servers);
  if (servers_flag.empty()) return UsageError("--servers is required");
  absl::StatusOr<std::vector<std::string>> servers =
      ParseServerList(servers_flag);
  if (!servers.ok()) {
    return UsageError(absl::StrCat("--servers: ", servers.status().message()));
  }
  const absl::Duration timeout =
      command == "checkpoint" && given.count("timeout") == 0
          ? kCheckpointTimeout
          : absl::GetFlag(FLAGS_timeout);
  if (timeout <= absl::ZeroDuration()) {
    return UsageError(absl::StrCat("--timeout must be > 0, got ",
                                   absl::FormatDuration(timeout)));
  }
  const absl::Duration watch = absl::GetFlag(FLAGS_watch);
  if (watch < absl::ZeroDuration()) {
    return UsageError(absl::StrCat("--watch must be >= 0, got ",
                                   absl::FormatDuration(watch)));
  }
  if (watch > absl::ZeroDuration() && command != "status") {
    return UsageError("--watch applies only to the status command");
  }
  const bool json = absl::GetFlag(FLAGS_json);
  absl::StatusOr<SecurityOptions> security = SecurityFromFlags();
  if (!security.ok()) {
    return UsageError(std::string(security.status().message()));
  }

  ShardQuery query(*std::move(servers), *security);
  if (command == "checkpoint") return RunCheckpoint(query, timeout, json);
  return command == "status" ? RunStatus(query, timeout, watch, json)
                             : RunTensors(query, timeout, json);
}

}  // namespace
}  // namespace asyncps

int main(int argc, char** argv) { return asyncps::Main(argc, argv); }
