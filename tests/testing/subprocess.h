#ifndef ASYNCPS_TESTS_TESTING_SUBPROCESS_H_
#define ASYNCPS_TESTS_TESTING_SUBPROCESS_H_

// Helpers for tests that run asyncps binaries as separate processes: start a
// binary from the test's runfiles with its output captured to a log file,
// wait for it with a deadline, and make sure that nothing it started outlives
// the test.

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace asyncps {
namespace testing {

// The path of `relative` (e.g. "server/ps_server") in the test's Bazel
// runfiles: $TEST_SRCDIR/asyncps/<relative>, or, for a test binary started by
// hand, <this binary>.runfiles/asyncps/<relative>.
std::string RunfilePath(absl::string_view relative);

// The test's scratch directory: $TEST_TMPDIR, or, for a binary run by hand
// (a benchmark), a folder of its own under /tmp that goes at its normal exit
// (its servers' logs with it) unless ASYNCPS_KEEP_TMP is set.
std::string TestTmpDir();

// A fresh path in TestTmpDir() whose file name starts with `stem`; distinct on
// every call within the process.
std::string UniqueTmpPath(absl::string_view stem);

// A new, empty directory at UniqueTmpPath(stem).
std::string MakeTmpDir(absl::string_view stem);

// Removes a directory and everything in it when destroyed (none when
// default-made or moved from): scratch that must not outlive a benchmark
// run outside Bazel, whose TestTmpDir() is /tmp. Move-only.
class OwnedTmpDir {
 public:
  OwnedTmpDir() = default;
  explicit OwnedTmpDir(std::string path) : path_(std::move(path)) {}
  OwnedTmpDir(OwnedTmpDir&& other) noexcept
      : path_(std::exchange(other.path_, std::string())) {}
  OwnedTmpDir& operator=(OwnedTmpDir&& other) noexcept;
  OwnedTmpDir(const OwnedTmpDir&) = delete;
  OwnedTmpDir& operator=(const OwnedTmpDir&) = delete;
  ~OwnedTmpDir();

 private:
  std::string path_;
};

// "127.0.0.1:<port>" where nothing listens: a loopback port bound, read back
// and released (for clients of a shard that is not there, or not yet).
absl::StatusOr<std::string> UnusedLoopbackAddress();

// Whether a socket with SO_REUSEADDR (as gRPC's listeners have) can bind
// 127.0.0.1:`port` and listen there now (it is closed again at once).
bool LoopbackPortBindable(int port);

// Runs `body` in a forked child of this process and returns the status it
// exits with (128 + the signal when one ends it, -1 when the fork or the
// wait fails). For what must not touch the test process itself: resource
// limits (RLIMIT_FSIZE as a full disk), locks held by another process. The
// child leaves with _exit: no Catch2 output, no destructors of the parent's
// objects.
int ExitStatusInChild(const std::function<int()>& body);

// Polls `condition` every `poll` until it returns true (OK) or `timeout`
// passes (DEADLINE_EXCEEDED naming `what`). The condition is called at least
// once.
absl::Status WaitFor(const std::function<bool()>& condition,
                     absl::Duration timeout, absl::string_view what,
                     absl::Duration poll = absl::Milliseconds(10));

// One child process, started in its own process group with stdin from
// /dev/null and stdout + stderr appended to a log file. The child is also
// killed by the kernel (SIGKILL) if the thread that started it exits, so a
// crashing test leaves nothing behind; start children from a thread that
// outlives them (normally the test's main thread).
//
// The destructor always ends the child: SIGTERM to its process group, SIGKILL
// after a grace period, then reaps it by PID. Whenever the child is reaped,
// whatever else is still in its process group is SIGKILLed first.
//
// Thread-compatible: one thread drives a Subprocess.
class Subprocess {
 public:
  // Starts `binary` (a path, not searched in PATH) with `args` (argv[1..]).
  // `log_path` empty means UniqueTmpPath(<binary's base name>) + ".log".
  // Fails if the binary cannot be executed.
  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(
      const std::string& binary, const std::vector<std::string>& args,
      const std::string& log_path = "");

  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  ~Subprocess();

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }
  // The binary and its arguments, for messages.
  const std::string& command_line() const { return command_line_; }

  // True while the child has not exited. Does not reap it.
  bool Running();

  // Waits up to `timeout` for the child to exit and returns its exit status:
  // the exit code when it exited, or -N when signal N ended it (like Python's
  // subprocess). DEADLINE_EXCEEDED if it is still running. Once the child has
  // been reaped, returns the same status again at once.
  absl::StatusOr<int> Wait(absl::Duration timeout);

  // Sends SIGTERM to the child's process group, waits up to `grace`, then
  // SIGKILLs the group and reaps the child. Returns its exit status as Wait()
  // does (-15 after a clean SIGTERM exit, -9 when it had to be killed). A
  // child that already exited is only reaped.
  absl::StatusOr<int> Kill(absl::Duration grace = absl::Seconds(5));

  // Sends `signal` to the child's process group (no-op once reaped).
  absl::Status Signal(int signal);

  // The log file's contents so far ("" if it cannot be read).
  std::string ReadLog() const;
  // The last `max_bytes` bytes of the log, for failure messages.
  std::string LogTail(size_t max_bytes = 4000) const;

 private:
  Subprocess(pid_t pid, std::string log_path, std::string command_line)
      : pid_(pid),
        log_path_(std::move(log_path)),
        command_line_(std::move(command_line)) {}

  // Reaps the child if it has exited (after SIGKILLing the rest of its
  // group). Returns true if it is reaped.
  bool TryReap();

  const pid_t pid_;
  const std::string log_path_;
  const std::string command_line_;
  bool reaped_ = false;
  int exit_status_ = 0;  // valid when reaped_
};

// A running `ps_server` shard and the address it listens on.
// Waits up to `timeout` for `process` to write a port (one full line) to
// `port_file` and returns it. Fails fast, with the log tail in the message,
// if the process exits first; `what` names it in errors ("shard 0").
absl::StatusOr<int> WaitForPortFile(const std::string& port_file,
                                    Subprocess* process, absl::Duration timeout,
                                    absl::string_view what);

struct ServerProcess {
  std::unique_ptr<Subprocess> process;
  std::string address;  // "127.0.0.1:<port>"
};

// What a tool run to its end printed and returned.
struct ToolRun {
  int exit_code = -1;
  std::string output;  // stdout + stderr
};

// Runs runfile `relative` (e.g. "tools/psctl") with `args` and waits up to
// `timeout` for it to exit (DEADLINE_EXCEEDED naming it otherwise; it is
// killed).
absl::StatusOr<ToolRun> RunTool(absl::string_view relative,
                                const std::vector<std::string>& args,
                                absl::Duration timeout = absl::Seconds(60));

// Starts runfile server/ps_server as shard `shard_index` of `num_shards` with
// --port=0 and a fresh --port_file, plus `extra_args` (e.g. "--slice_elems=8"),
// and waits up to `timeout` for the port file to hold a full line. Fails fast,
// with the log tail in the message, if the server exits first.
// `port` > 0 binds that port instead (a shard restarted where its workers
// look for it).
absl::StatusOr<ServerProcess> StartPsServer(
    int shard_index, int num_shards,
    const std::vector<std::string>& extra_args = {},
    absl::Duration timeout = absl::Seconds(30), int port = 0);

// Starts `num_shards` shards (see StartPsServer) and returns them in shard
// order.
absl::StatusOr<std::vector<ServerProcess>> StartPsCluster(
    int num_shards, const std::vector<std::string>& extra_args = {},
    absl::Duration timeout = absl::Seconds(30));

// "addr0,addr1,..." for --servers flags.
std::string ServerList(const std::vector<ServerProcess>& servers);

// What a running process holds and has used, from /proc/<pid>/status and
// /proc/<pid>/stat.
struct ProcessResources {
  int64_t rss_bytes = 0;       // VmRSS
  int64_t peak_rss_bytes = 0;  // VmHWM: the most it has held
  int threads = 0;             // Threads
  double cpu_seconds = 0;      // user + system time so far
  double system_seconds = 0;   // of which in the kernel
  int64_t minor_faults = 0;    // pages the kernel gave it on first touch
};

// NOT_FOUND when the process is gone (or /proc cannot be read).
absl::StatusOr<ProcessResources> ReadProcessResources(pid_t pid);

}  // namespace testing
}  // namespace asyncps

#endif  // ASYNCPS_TESTS_TESTING_SUBPROCESS_H_
