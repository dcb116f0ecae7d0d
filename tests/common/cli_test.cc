// The shared command-line parser (common/cli.h) with flags of its own: exit
// statuses, help contents, environment variables and their precedence.
#include "common/cli.h"

#include <catch2/catch.hpp>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"

ABSL_FLAG(int, cli_port, 7000, "A port for the test.");
ABSL_FLAG(std::string, cli_name, "default", "A name for the test.");
ABSL_FLAG(bool, cli_verbose, false, "A switch for the test.");

namespace asyncps {
namespace {

// The fake environment the parser reads.
std::map<std::string, std::string>* fake_env =
    new std::map<std::string, std::string>();

std::optional<std::string> FakeEnv(const char* name) {
  auto it = fake_env->find(name);
  if (it == fake_env->end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> FakeNames() {
  std::vector<std::string> names;
  for (const auto& [name, value] : *fake_env) names.push_back(name);
  return names;
}

void ResetFlags() {
  absl::SetFlag(&FLAGS_cli_port, 7000);
  absl::SetFlag(&FLAGS_cli_name, "default");
  absl::SetFlag(&FLAGS_cli_verbose, false);
  fake_env->clear();
}

ParseResult Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "prog");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  ProgramInfo program;
  program.name = "prog";
  program.version = "9.9";
  program.usage = "prog: a test program.";
  program.short_aliases = {{"n", "cli_name"}};
  return ParseProgramCommandLine(static_cast<int>(argv.size()), argv.data(),
                                 program, &FakeEnv, &FakeNames);
}

TEST_CASE("flags in every syntax set their values; positionals are kept",
          "[cli]") {
  ResetFlags();
  ParseResult r = Parse({"run", "--cli_port=1", "-cli_name", "x",
                         "--cli_verbose", "--", "--not-a-flag"});
  REQUIRE(r.command_line.has_value());
  CHECK(absl::GetFlag(FLAGS_cli_port) == 1);
  CHECK(absl::GetFlag(FLAGS_cli_name) == "x");
  CHECK(absl::GetFlag(FLAGS_cli_verbose));
  CHECK(r.command_line->positional ==
        std::vector<std::string>{"run", "--not-a-flag"});
  CHECK(r.command_line->set_by.at("cli_port") == "--cli_port");

  ResetFlags();
  r = Parse({"--nocli_verbose", "-ny"});
  REQUIRE(r.command_line.has_value());
  CHECK_FALSE(absl::GetFlag(FLAGS_cli_verbose));
  CHECK(absl::GetFlag(FLAGS_cli_name) == "y");
  ResetFlags();
  r = Parse({"-n", "z"});
  REQUIRE(r.command_line.has_value());
  CHECK(absl::GetFlag(FLAGS_cli_name) == "z");
}

TEST_CASE("bad flags exit 2 and change nothing", "[cli]") {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"--cli_prot=1"},
                                             {"--cli_port=x"},
                                             {"--cli_port"},
                                             {"--nocli_verbose=1"},
                                             {"--flagfile=f"},
                                             {"--cli_port=5", "--bogus"}}) {
    ResetFlags();
    const ParseResult r = Parse(args);
    INFO(args[0]);
    CHECK_FALSE(r.command_line.has_value());
    CHECK(r.exit_code == 2);
    CHECK(absl::GetFlag(FLAGS_cli_port) == 7000);
  }
}

TEST_CASE("--help and --version exit 0 without parsing further", "[cli]") {
  ResetFlags();
  ParseResult r = Parse({"--help", "--cli_port=1"});
  CHECK_FALSE(r.command_line.has_value());
  CHECK(r.exit_code == 0);
  CHECK(absl::GetFlag(FLAGS_cli_port) == 7000);
  r = Parse({"-h"});
  CHECK(r.exit_code == 0);
  r = Parse({"--version"});
  CHECK_FALSE(r.command_line.has_value());
  CHECK(r.exit_code == 0);
}

TEST_CASE("help lists the program's flags with defaults, not absl's", "[cli]") {
  ProgramInfo program;
  program.name = "prog";
  program.usage = "prog: a test program.";
  const std::string help = HelpText(program, "", false);
  CHECK(absl::StartsWith(help, "prog: a test program."));
  CHECK(absl::StrContains(help, "--cli_port=7000\n      A port for the test."));
  CHECK(absl::StrContains(help, "--cli_name=\"default\""));
  CHECK(absl::StrContains(help, "--cli_verbose=false"));
  CHECK(absl::StrContains(help, "ASYNCPS_<FLAG>"));
  CHECK_FALSE(absl::StrContains(help, "--flagfile"));
  const std::string some = HelpText(program, "name", false);
  CHECK(absl::StrContains(some, "--cli_name"));
  CHECK_FALSE(absl::StrContains(some, "--cli_port"));
}

TEST_CASE("ASYNCPS_<FLAG> sets a flag; the command line wins", "[cli]") {
  CHECK(FlagEnvironmentVariable("cli_port") == "ASYNCPS_CLI_PORT");
  ResetFlags();
  (*fake_env)["ASYNCPS_CLI_PORT"] = "8";
  (*fake_env)["ASYNCPS_CLI_NAME"] = "from-env";
  (*fake_env)["ASYNCPS_UNRELATED_SETTING"] = "ignored";
  ParseResult r = Parse({"--cli_name=from-flag"});
  REQUIRE(r.command_line.has_value());
  CHECK(absl::GetFlag(FLAGS_cli_port) == 8);
  CHECK(absl::GetFlag(FLAGS_cli_name) == "from-flag");
  CHECK(r.command_line->set_by.at("cli_port") == "ASYNCPS_CLI_PORT");
  CHECK(r.command_line->set_by.at("cli_name") == "--cli_name");

  // A bad value in the environment is an error, unless a flag overrides it.
  ResetFlags();
  (*fake_env)["ASYNCPS_CLI_PORT"] = "eight";
  r = Parse({});
  CHECK(r.exit_code == 2);
  ResetFlags();
  (*fake_env)["ASYNCPS_CLI_PORT"] = "eight";
  r = Parse({"--cli_port=9"});
  REQUIRE(r.command_line.has_value());
  CHECK(absl::GetFlag(FLAGS_cli_port) == 9);

  // Empty counts as unset.
  ResetFlags();
  (*fake_env)["ASYNCPS_CLI_PORT"] = "";
  r = Parse({});
  REQUIRE(r.command_line.has_value());
  CHECK(absl::GetFlag(FLAGS_cli_port) == 7000);
  CHECK_FALSE(r.command_line->IsSet("cli_port"));
}

}  // namespace
}  // namespace asyncps

namespace asyncps {
namespace {

TEST_CASE(
    "ASYNCPS_ variables that set no flag are warned about, naming the "
    "closest flag; the launch scripts' own settings are not",
    "[cli]") {
  ResetFlags();
  (*fake_env)["ASYNCPS_CLI_PORTT"] = "8";
  (*fake_env)["ASYNCPS_SOMETHING_ELSE"] = "1";
  (*fake_env)["ASYNCPS_BIN"] = "/opt/asyncps";
  (*fake_env)["ASYNCPS_SHARDS"] = "2";
  (*fake_env)["ASYNCPS_SERVERS_"] = "h:1";  // a script's hand-over
  (*fake_env)["ASYNCPS_CLI_NAME"] = "ok";
  (*fake_env)["OTHER_VARIABLE"] = "x";
  ParseResult r = Parse({});
  REQUIRE(r.command_line.has_value());
  CHECK(absl::GetFlag(FLAGS_cli_name) == "ok");
  CHECK(absl::GetFlag(FLAGS_cli_port) == 7000);  // the typo set nothing
  const std::vector<std::string>& w = r.command_line->warnings;
  REQUIRE(w.size() == 2);
  CHECK(absl::StrContains(w[0], "ASYNCPS_CLI_PORTT sets no flag of prog"));
  CHECK(absl::StrContains(w[0], "did you mean ASYNCPS_CLI_PORT, --cli_port?"));
  CHECK(absl::StrContains(w[1], "ASYNCPS_SOMETHING_ELSE"));
  CHECK_FALSE(absl::StrContains(w[1], "did you mean"));
}

}  // namespace
}  // namespace asyncps
