#include "common/cli.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <utility>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace asyncps {
namespace {

constexpr absl::string_view kEnvPrefix = "ASYNCPS_";
constexpr absl::string_view kSecurityFlagsFile = "common/security_flags.cc";

// absl's own flags (--flagfile, --help, ...) live in absl's sources.
bool IsAbslFlag(const absl::CommandLineFlag& flag) {
  return absl::StrContains(flag.Filename(), "absl/");
}

// Program flags in name order.
std::vector<const absl::CommandLineFlag*> SortedFlags(bool include_absl) {
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (include_absl || !IsAbslFlag(*flag)) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
  return flags;
}

// Edit distance, for "did you mean" suggestions.
size_t Distance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1,
                         diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The program's flag closest to `name` when it is close enough to be a
// typo of it, else nullptr.
const absl::CommandLineFlag* ClosestFlag(absl::string_view name) {
  const absl::CommandLineFlag* best = nullptr;
  size_t best_distance = 0;
  for (const absl::CommandLineFlag* f : SortedFlags(false)) {
    const size_t d = Distance(name, f->Name());
    if (best == nullptr || d < best_distance) {
      best = f;
      best_distance = d;
    }
  }
  const size_t limit = std::max<size_t>(2, name.size() / 3);
  return best != nullptr && best_distance <= limit ? best : nullptr;
}

std::string Suggestion(absl::string_view name) {
  const absl::CommandLineFlag* best = ClosestFlag(name);
  if (best == nullptr) return "";
  return absl::StrCat(" (did you mean --", best->Name(), "?)");
}

// Settings of asyncps's launch scripts (deploy/, tests/), read by the
// scripts and not by the binaries: never warned about.
constexpr absl::string_view kScriptSettings[] = {
    "ADDRESS",       "BASE_PORT",    "BIN",          "BUNDLE_GLIBC",
    "EPOCHS",        "EXAMPLES",     "GPU_OPTIONAL", "PEAK_TFLOPS",
    "REQUIRE_CUDA",  "RUN_DIR",      "SERVER_FLAGS", "SHARDS",
    "START_TIMEOUT", "STOP_TIMEOUT", "UNPACK_WITH",  "WORKER_FLAGS",
    "WORKERS"};

// One warning per ASYNCPS_* variable among `names` that sets no flag of
// this program, naming the flag it is closest to.
std::vector<std::string> UnknownVariableWarnings(
    const ProgramInfo& program, const std::vector<std::string>& names) {
  std::vector<std::string> warnings;
  for (const std::string& variable : names) {
    absl::string_view rest = variable;
    if (!absl::ConsumePrefix(&rest, kEnvPrefix) || rest.empty()) continue;
    // The scripts hand their own values to the processes they start as
    // ASYNCPS_<NAME>_ (a trailing underscore), apart from the flags.
    if (absl::EndsWith(rest, "_")) continue;
    if (std::find(std::begin(kScriptSettings), std::end(kScriptSettings),
                  rest) != std::end(kScriptSettings)) {
      continue;
    }
    const std::string flag = absl::AsciiStrToLower(rest);
    const absl::CommandLineFlag* f = absl::FindCommandLineFlag(flag);
    if (f != nullptr && !IsAbslFlag(*f)) continue;
    const absl::CommandLineFlag* close = ClosestFlag(flag);
    warnings.push_back(absl::StrCat(
        "environment variable ", variable, " sets no flag of ", program.name,
        " and is ignored",
        close != nullptr ? absl::StrCat(" (did you mean ",
                                        FlagEnvironmentVariable(close->Name()),
                                        ", --", close->Name(), "?)")
                         : ""));
  }
  return warnings;
}

// Word-wraps `text` to 80 columns, every line indented by `indent`.
std::string Wrap(absl::string_view text, size_t indent) {
  std::string out;
  std::string line(indent, ' ');
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (line.size() > indent && line.size() + 1 + word.size() > 80) {
      absl::StrAppend(&out, line, "\n");
      line.assign(indent, ' ');
    }
    if (line.size() > indent) line += ' ';
    absl::StrAppend(&line, word);
  }
  if (line.size() > indent) absl::StrAppend(&out, line, "\n");
  return out;
}

std::string DefaultText(const absl::CommandLineFlag& flag) {
  const std::string value = flag.DefaultValue();
  if (flag.IsOfType<std::string>()) return absl::StrCat("\"", value, "\"");
  return value;
}

// One flag to set: its value and where it came from.
struct Assignment {
  absl::CommandLineFlag* flag;
  std::string value;
  std::string source;  // "--name", or the variable's name
};

// What the parser makes of argv before anything is set.
struct Scan {
  std::vector<Assignment> assignments;
  std::vector<std::string> positional;
  enum class Action { kRun, kHelp, kHelpFull, kVersion } action = Action::kRun;
  std::string help_filter;
};

absl::StatusOr<Scan> ScanArguments(int argc, char** argv,
                                   const ProgramInfo& program) {
  Scan scan;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") {
      for (++i; i < argc; ++i) scan.positional.emplace_back(argv[i]);
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      scan.positional.emplace_back(arg);
      continue;
    }
    absl::string_view body = arg.substr(arg[1] == '-' ? 2 : 1);
    const size_t eq = body.find('=');
    std::string name(body.substr(0, eq));
    std::optional<std::string> value;
    if (eq != absl::string_view::npos) value = std::string(body.substr(eq + 1));

    // Short aliases: -o json, -o=json, -ojson.
    if (arg[1] != '-') {
      auto alias = program.short_aliases.find(name.substr(0, 1));
      if (alias != program.short_aliases.end()) {
        if (name.size() > 1 && !value.has_value()) value = name.substr(1);
        if (name.size() == 1 || value.has_value()) name = alias->second;
      }
    }
    if (name == "help" || name == "h" || name == "helpshort") {
      scan.action = Scan::Action::kHelp;
      if (value.has_value()) scan.help_filter = *value;
      continue;
    }
    if (name == "helpfull") {
      scan.action = Scan::Action::kHelpFull;
      continue;
    }
    if (name == "version") {
      scan.action = Scan::Action::kVersion;
      continue;
    }
    if (name == "flagfile" || name == "fromenv" || name == "tryfromenv" ||
        name == "undefok") {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", name, " is not supported; set flags on the command line or ",
          "with ", kEnvPrefix, "<FLAG> environment variables"));
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag != nullptr && IsAbslFlag(*flag)) flag = nullptr;
    bool negated = false;
    if (flag == nullptr && absl::StartsWith(name, "no")) {
      absl::CommandLineFlag* positive =
          absl::FindCommandLineFlag(name.substr(2));
      if (positive != nullptr && !IsAbslFlag(*positive) &&
          positive->IsOfType<bool>()) {
        flag = positive;
        negated = true;
      }
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, Suggestion(name)));
    }
    if (negated) {
      if (value.has_value()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " takes no value"));
      }
      value = "false";
    } else if (!value.has_value()) {
      if (flag->IsOfType<bool>()) {
        value = "true";
      } else if (i + 1 < argc) {
        value = std::string(argv[++i]);
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("flag --", name, " needs a value"));
      }
    }
    scan.assignments.push_back(
        Assignment{flag, *std::move(value), absl::StrCat("--", flag->Name())});
  }
  return scan;
}

int Error(const ProgramInfo& program, absl::string_view message) {
  std::fprintf(stderr, "%s: %s (see %s --help)\n", program.name.c_str(),
               std::string(message).c_str(), program.name.c_str());
  return 2;
}

}  // namespace

std::string FlagEnvironmentVariable(absl::string_view flag) {
  return absl::StrCat(kEnvPrefix, absl::AsciiStrToUpper(flag));
}

std::optional<std::string> ProcessEnvironment(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

std::vector<std::string> ProcessEnvironmentNames() {
  std::vector<std::string> names;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    names.emplace_back(*e, eq == nullptr ? std::strlen(*e) : eq - *e);
  }
  return names;
}

std::string HelpText(const ProgramInfo& program, absl::string_view filter,
                     bool all) {
  std::string out = absl::StrCat(program.usage, "\n");
  // Groups in order: the program's flags, the shared security flags, then
  // (with --helpfull) absl's.
  struct Group {
    std::string title;
    std::vector<const absl::CommandLineFlag*> flags;
  };
  Group own{"Flags:", {}};
  Group security{
      "Security flags (the same on every asyncps binary; see README):", {}};
  Group absl_group{"Flags of the absl library (not supported here):", {}};
  for (const absl::CommandLineFlag* f : SortedFlags(all)) {
    if (!filter.empty() && !absl::StrContains(f->Name(), filter)) continue;
    if (IsAbslFlag(*f)) {
      absl_group.flags.push_back(f);
    } else if (absl::EndsWith(f->Filename(), kSecurityFlagsFile)) {
      security.flags.push_back(f);
    } else {
      own.flags.push_back(f);
    }
  }
  for (const Group* g : {&own, &security, &absl_group}) {
    if (g->flags.empty()) continue;
    absl::StrAppend(&out, "\n", g->title, "\n");
    for (const absl::CommandLineFlag* f : g->flags) {
      absl::StrAppend(&out, "  --", f->Name(), "=", DefaultText(*f), "\n",
                      Wrap(f->Help(), 6));
    }
  }
  absl::StrAppend(
      &out, "\nGeneral:\n  --help, -h        this text (--help=WORD: flags ",
      "whose name contains WORD)\n  --helpfull        also the absl ",
      "library's flags\n  --version         print the version and exit\n\n",
      Wrap(absl::StrCat(
               "Every flag can also be set with the environment variable ",
               kEnvPrefix, "<FLAG> (the flag's name in upper case, e.g. ",
               kEnvPrefix,
               "LOG_LEVEL=debug for --log_level=debug). A flag on the command "
               "line wins; an empty variable counts as unset. Unknown flags "
               "and bad values exit with status 2."),
           0));
  return out;
}

ParseResult ParseProgramCommandLine(int argc, char** argv,
                                    const ProgramInfo& program,
                                    EnvironmentLookup env,
                                    EnvironmentNames names) {
  ParseResult result;
  absl::StatusOr<Scan> scan = ScanArguments(argc, argv, program);
  if (!scan.ok()) {
    result.exit_code = Error(program, scan.status().message());
    return result;
  }
  switch (scan->action) {
    case Scan::Action::kHelp:
    case Scan::Action::kHelpFull: {
      const std::string text = HelpText(
          program, scan->help_filter, scan->action == Scan::Action::kHelpFull);
      std::fwrite(text.data(), 1, text.size(), stdout);
      result.exit_code = 0;
      return result;
    }
    case Scan::Action::kVersion:
      std::printf("%s %s\n", program.name.c_str(), program.version.c_str());
      result.exit_code = 0;
      return result;
    case Scan::Action::kRun:
      break;
  }

  std::set<std::string> on_command_line;
  for (const Assignment& a : scan->assignments) {
    on_command_line.insert(std::string(a.flag->Name()));
  }
  // The environment first, so that the command line overrides it.
  std::vector<Assignment> assignments;
  for (const absl::CommandLineFlag* f : SortedFlags(false)) {
    const std::string name(f->Name());
    if (on_command_line.count(name) > 0) continue;
    const std::string variable = FlagEnvironmentVariable(name);
    std::optional<std::string> value = env(variable.c_str());
    if (!value.has_value() || value->empty()) continue;
    assignments.push_back(Assignment{absl::FindCommandLineFlag(name),
                                     *std::move(value), variable});
  }
  for (Assignment& a : scan->assignments) assignments.push_back(std::move(a));

  ParsedCommandLine parsed;
  for (const Assignment& a : assignments) {
    std::string error;
    if (!a.flag->ParseFrom(a.value, &error)) {
      const bool from_env = !absl::StartsWith(a.source, "--");
      result.exit_code = Error(
          program, from_env ? absl::StrCat("environment variable ", a.source,
                                           "='", a.value, "' (--",
                                           a.flag->Name(), "): ", error)
                            : absl::StrCat("--", a.flag->Name(), ": ", error));
      return result;
    }
    parsed.set_by[std::string(a.flag->Name())] = a.source;
  }
  if (program.flags_only && !scan->positional.empty()) {
    result.exit_code = Error(
        program, absl::StrCat("unexpected argument '", scan->positional[0],
                              "' (", program.name, " takes only flags)"));
    return result;
  }
  parsed.positional = std::move(scan->positional);
  parsed.warnings = UnknownVariableWarnings(program, names());
  result.command_line = std::move(parsed);
  return result;
}

}  // namespace asyncps
