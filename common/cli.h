#ifndef ASYNCPS_COMMON_CLI_H_
#define ASYNCPS_COMMON_CLI_H_

// Command-line handling shared by ps_server, ps_worker and psctl: one
// parser with the same rules, help and exit statuses for every binary.
//
//   - `--help` (or `-h`) prints the program's own flags (those defined
//     outside absl) with their defaults and exits 0; `--help=WORD` only the
//     flags whose name contains WORD; `--helpfull` every registered flag.
//   - `--version` prints "<program> <version>" and exits 0.
//   - An unknown flag, a flag without its value or a bad value prints one
//     line naming the flag (with the closest known name for a typo) and
//     exits 2.
//   - Every flag can also be set with the environment variable
//     ASYNCPS_<FLAG_NAME> (the name upper-cased, e.g. ASYNCPS_SHARD_INDEX
//     for --shard_index). A flag given on the command line wins; an empty
//     variable counts as unset; a bad value exits 2 naming the variable.
//     A variable with the prefix that names no flag of this program (a
//     typo such as ASYNCPS_SSP_SLAK) is ignored with a warning naming the
//     closest flag (ParsedCommandLine::warnings, for the program to log);
//     the settings asyncps's launch scripts read themselves (ASYNCPS_BIN,
//     ASYNCPS_SHARDS, ...) and the values they hand to the processes they
//     start (names ending in '_', e.g. ASYNCPS_SERVERS_) are not warned
//     about.
//
// absl 20220623's ParseCommandLine exits 1 on such errors and its --help
// lists only flags defined in a file named after the binary, so this parser
// replaces it. It uses absl's public flag reflection (FindCommandLineFlag,
// GetAllFlags, CommandLineFlag::ParseFrom) and nothing internal. absl's
// --flagfile, --fromenv, --tryfromenv and --undefok are not supported
// (environment variables cover their use); they exit 2 saying so.
//
// Flag syntax as absl's: --name=value, --name value (not for booleans),
// -name for --name, --name / --noname for booleans, `--` ends the flags.
// Short aliases (e.g. -o for --output) also accept -oVALUE.

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace asyncps {

// What a program tells the parser about itself.
struct ProgramInfo {
  std::string name;     // "ps_server": prefix of messages, --version
  std::string version;  // printed by --version
  // Shown at the top of --help: what the program does and how to call it.
  std::string usage;
  // Single-letter aliases of long flags, e.g. {"o", "output"}.
  std::map<std::string, std::string> short_aliases;
  // A non-flag argument is an error (exit 2, "unexpected argument").
  bool flags_only = false;
};

// The outcome of a successful parse.
struct ParsedCommandLine {
  // The non-flag arguments in order (argv[0] not included).
  std::vector<std::string> positional;
  // Every flag that was set, by its name, and where its value came from:
  // "--name" or "ASYNCPS_NAME".
  std::map<std::string, std::string> set_by;
  // One line per ASYNCPS_* variable that sets no flag (to be logged as a
  // warning at start).
  std::vector<std::string> warnings;

  bool IsSet(absl::string_view flag) const {
    return set_by.count(std::string(flag)) > 0;
  }
};

// The environment variable that sets `flag`: "ASYNCPS_" + upper-cased name.
std::string FlagEnvironmentVariable(absl::string_view flag);

// A source of environment variables (getenv by default), for tests.
using EnvironmentLookup = std::optional<std::string> (*)(const char* name);
std::optional<std::string> ProcessEnvironment(const char* name);
// The names of the environment's variables (environ by default), for tests.
using EnvironmentNames = std::vector<std::string> (*)();
std::vector<std::string> ProcessEnvironmentNames();

// The result of parsing: either a command line to run with, or the exit
// status of a program that is done (help or version printed to stdout, or an
// error printed to stderr).
struct ParseResult {
  std::optional<ParsedCommandLine> command_line;
  int exit_code = 0;  // when !command_line
};

// Parses argv, applying the ASYNCPS_* environment variables first, and sets
// the flags. Prints help, version and errors itself (see above).
ParseResult ParseProgramCommandLine(
    int argc, char** argv, const ProgramInfo& program,
    EnvironmentLookup env = &ProcessEnvironment,
    EnvironmentNames names = &ProcessEnvironmentNames);

// The help text --help prints (`filter` non-empty: only flags whose name
// contains it; `all`: absl's own flags too).
std::string HelpText(const ProgramInfo& program, absl::string_view filter,
                     bool all);

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_CLI_H_
