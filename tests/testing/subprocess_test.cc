#include "tests/testing/subprocess.h"

#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace asyncps {
namespace testing {
namespace {

std::unique_ptr<Subprocess> StartShell(const std::string& script) {
  absl::StatusOr<std::unique_ptr<Subprocess>> p =
      Subprocess::Start("/bin/sh", {"-c", script});
  REQUIRE(p.ok());
  return *std::move(p);
}

// True once `pid` is gone or only a zombie waiting for someone else to reap it.
bool ProcessGone(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');
  return paren == std::string::npos ||
         (paren + 2 < line.size() && line[paren + 2] == 'Z');
}

pid_t ReadPidFile(const std::string& path) {
  pid_t pid = 0;
  REQUIRE(WaitFor(
              [&] {
                std::ifstream in(path);
                std::string s;
                return std::getline(in, s) &&
                       absl::SimpleAtoi(absl::StripAsciiWhitespace(s), &pid);
              },
              absl::Seconds(10), path)
              .ok());
  return pid;
}

TEST_CASE("exit code and both output streams are captured", "[subprocess]") {
  auto p = StartShell("echo to-stdout; echo to-stderr >&2; exit 3");
  absl::StatusOr<int> code = p->Wait(absl::Seconds(10));
  REQUIRE(code.ok());
  CHECK(*code == 3);
  CHECK(absl::StrContains(p->ReadLog(), "to-stdout"));
  CHECK(absl::StrContains(p->ReadLog(), "to-stderr"));
  CHECK(absl::StartsWith(p->log_path(), TestTmpDir()));
  // Waiting again answers the same status.
  CHECK(*p->Wait(absl::ZeroDuration()) == 3);
}

TEST_CASE("wait on a running process reports a deadline", "[subprocess]") {
  auto p = StartShell("sleep 30");
  CHECK(p->Running());
  absl::StatusOr<int> code = p->Wait(absl::Milliseconds(50));
  CHECK(absl::IsDeadlineExceeded(code.status()));
  absl::StatusOr<int> killed = p->Kill();
  REQUIRE(killed.ok());
  CHECK(*killed == -SIGTERM);
  CHECK_FALSE(p->Running());
}

TEST_CASE("kill escalates to SIGKILL when SIGTERM is ignored", "[subprocess]") {
  auto p = StartShell("trap '' TERM; echo ready; sleep 30");
  REQUIRE(WaitFor([&] { return absl::StrContains(p->ReadLog(), "ready"); },
                  absl::Seconds(10), "shell to start")
              .ok());
  absl::StatusOr<int> killed = p->Kill(absl::Milliseconds(100));
  REQUIRE(killed.ok());
  CHECK(*killed == -SIGKILL);
}

TEST_CASE("the destructor ends the whole process group", "[subprocess]") {
  const std::string pid_file = UniqueTmpPath("grandchild") + ".pid";
  pid_t grandchild = 0;
  {
    auto p =
        StartShell(absl::StrCat("sleep 30 & echo $! > ", pid_file, "; wait"));
    grandchild = ReadPidFile(pid_file);
    CHECK_FALSE(ProcessGone(grandchild));
  }
  CHECK(WaitFor([&] { return ProcessGone(grandchild); }, absl::Seconds(10),
                "grandchild to die")
            .ok());
}

TEST_CASE("what an exited child leaves in its group is killed on reap",
          "[subprocess]") {
  const std::string pid_file = UniqueTmpPath("orphan") + ".pid";
  auto p =
      StartShell(absl::StrCat("sleep 30 & echo $! > ", pid_file, "; exit 0"));
  const pid_t orphan = ReadPidFile(pid_file);
  absl::StatusOr<int> code = p->Wait(absl::Seconds(10));
  REQUIRE(code.ok());
  CHECK(*code == 0);
  CHECK(WaitFor([&] { return ProcessGone(orphan); }, absl::Seconds(10),
                "orphan to die")
            .ok());
}

TEST_CASE("a binary that cannot be executed fails to start", "[subprocess]") {
  absl::StatusOr<std::unique_ptr<Subprocess>> p =
      Subprocess::Start("/nonexistent/binary", {});
  REQUIRE_FALSE(p.ok());
  CHECK(absl::StrContains(p.status().message(), "/nonexistent/binary"));
}

TEST_CASE("WaitFor honours its deadline", "[subprocess]") {
  int calls = 0;
  absl::Status s = WaitFor(
      [&] {
        ++calls;
        return false;
      },
      absl::Milliseconds(30), "never");
  CHECK(absl::IsDeadlineExceeded(s));
  CHECK(absl::StrContains(s.message(), "never"));
  CHECK(calls >= 1);
  CHECK(WaitFor([] { return true; }, absl::ZeroDuration(), "at once").ok());
}

TEST_CASE("runfile paths live under the test's runfiles tree", "[subprocess]") {
  const std::string path = RunfilePath("server/ps_server");
  CHECK(absl::EndsWith(path, "/asyncps/server/ps_server"));
}

}  // namespace
}  // namespace testing
}  // namespace asyncps
