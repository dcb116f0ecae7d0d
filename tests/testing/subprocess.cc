#include "tests/testing/subprocess.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace asyncps {
namespace testing {
namespace {

std::string ErrnoMessage(absl::string_view what, int err) {
  return absl::StrCat(what, ": ", std::strerror(err));
}

// Closes a file descriptor on scope exit.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

}  // namespace

std::string RunfilePath(absl::string_view relative) {
  if (const char* srcdir = std::getenv("TEST_SRCDIR");
      srcdir != nullptr && *srcdir != '\0') {
    return absl::StrCat(srcdir, "/asyncps/", relative);
  }
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  const std::string exe = n > 0 ? std::string(self, n) : std::string();
  return absl::StrCat(exe, ".runfiles/asyncps/", relative);
}

namespace {

// The folder of a process run by hand (no TEST_TMPDIR), and who made it.
std::string* hand_run_dir = nullptr;
pid_t hand_run_owner = 0;

void RemoveHandRunDir() {
  if (getpid() != hand_run_owner ||
      std::getenv("ASYNCPS_KEEP_TMP") != nullptr) {
    return;
  }
  std::error_code ignored;
  std::filesystem::remove_all(*hand_run_dir, ignored);
}

}  // namespace

std::string TestTmpDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  if (tmp != nullptr && *tmp != '\0') return tmp;
  static const bool made = [] {
    char path[] = "/tmp/asyncps-run.XXXXXX";
    hand_run_dir = new std::string(mkdtemp(path) != nullptr ? path : "/tmp");
    if (*hand_run_dir != "/tmp") {
      hand_run_owner = getpid();
      std::atexit(RemoveHandRunDir);
    }
    return true;
  }();
  (void)made;
  return *hand_run_dir;
}

std::string UniqueTmpPath(absl::string_view stem) {
  static std::atomic<int> counter{0};
  return absl::StrCat(TestTmpDir(), "/", stem, ".", getpid(), ".",
                      counter.fetch_add(1));
}

std::string MakeTmpDir(absl::string_view stem) {
  const std::string dir = UniqueTmpPath(stem);
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

OwnedTmpDir& OwnedTmpDir::operator=(OwnedTmpDir&& other) noexcept {
  if (this != &other) {
    OwnedTmpDir gone(std::move(*this));
    path_ = std::exchange(other.path_, std::string());
  }
  return *this;
}

OwnedTmpDir::~OwnedTmpDir() {
  if (path_.empty()) return;
  std::error_code ignored;  // nothing to do about a failure here
  std::filesystem::remove_all(path_, ignored);
}

absl::Status WaitFor(const std::function<bool()>& condition,
                     absl::Duration timeout, absl::string_view what,
                     absl::Duration poll) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (condition()) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("timed out after ", absl::FormatDuration(timeout),
                       " waiting for ", what));
    }
    absl::SleepFor(poll);
  }
}

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(
    const std::string& binary, const std::vector<std::string>& args,
    const std::string& log_path) {
  std::string log = log_path;
  if (log.empty()) {
    const size_t slash = binary.rfind('/');
    log = UniqueTmpPath(slash == std::string::npos ? binary
                                                   : binary.substr(slash + 1)) +
          ".log";
  }
  std::string command_line = binary;
  if (!args.empty())
    absl::StrAppend(&command_line, " ", absl::StrJoin(args, " "));

  // Everything the child needs is prepared before fork(): between fork() and
  // exec() a child of a multi-threaded process may only make
  // async-signal-safe calls.
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(binary.c_str()));
  for (const std::string& a : args)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // The child's environment: this process's, with TMPDIR set to the test's
  // temporary directory under a test runner, so that what a killed child
  // leaves there goes with the test's files.
  const char* test_tmp = std::getenv("TEST_TMPDIR");
  const std::string tmpdir = test_tmp != nullptr && *test_tmp != '\0'
                                 ? absl::StrCat("TMPDIR=", test_tmp)
                                 : "";
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) {
    if (!tmpdir.empty() && absl::StartsWith(*e, "TMPDIR=")) continue;
    envp.push_back(*e);
  }
  if (!tmpdir.empty()) envp.push_back(const_cast<char*>(tmpdir.c_str()));
  envp.push_back(nullptr);

  const int log_fd =
      open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return absl::InternalError(ErrnoMessage(absl::StrCat("open ", log), errno));
  }
  FdCloser close_log(log_fd);
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd < 0) {
    return absl::InternalError(ErrnoMessage("open /dev/null", errno));
  }
  FdCloser close_null(null_fd);
  // The child reports a failed exec() through this pipe; a successful exec()
  // closes it (O_CLOEXEC) and the parent reads end-of-file.
  int err_pipe[2];
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    return absl::InternalError(ErrnoMessage("pipe2", errno));
  }
  FdCloser close_err_read(err_pipe[0]);
  const pid_t parent = getpid();

  const pid_t pid = fork();
  if (pid < 0) {
    const int err = errno;
    close(err_pipe[1]);
    return absl::InternalError(ErrnoMessage("fork", err));
  }
  if (pid == 0) {
    // Child.
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);  // the parent died already
    dup2(null_fd, STDIN_FILENO);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    // Signal dispositions set to "ignore" and the blocked mask survive
    // exec(); give the binary a clean slate.
    struct sigaction dfl;
    std::memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; ++sig) sigaction(sig, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execve(binary.c_str(), argv.data(), envp.data());
    const int err = errno;
    ssize_t ignored = write(err_pipe[1], &err, sizeof(err));
    (void)ignored;
    _exit(127);
  }

  // Parent. Also set the group here so that it is in place before any
  // signal this process might send (EACCES after the child's exec is fine).
  setpgid(pid, pid);
  close(err_pipe[1]);
  int child_err = 0;
  ssize_t n;
  do {
    n = read(err_pipe[0], &child_err, sizeof(child_err));
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof(child_err))) {
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return absl::FailedPreconditionError(
        ErrnoMessage(absl::StrCat("exec ", binary), child_err));
  }
  return std::unique_ptr<Subprocess>(
      new Subprocess(pid, std::move(log), std::move(command_line)));
}

Subprocess::~Subprocess() {
  if (reaped_) return;
  absl::StatusOr<int> status = Kill();
  if (!status.ok()) {
    std::fprintf(stderr, "Subprocess: could not end pid %d (%s): %s\n",
                 static_cast<int>(pid_), command_line_.c_str(),
                 status.status().ToString().c_str());
  }
}

bool Subprocess::TryReap() {
  if (reaped_) return true;
  siginfo_t info;
  std::memset(&info, 0, sizeof(info));
  // WNOWAIT leaves the child a zombie, which keeps its PID (and so its
  // process group ID) from being reused while the group is swept.
  if (waitid(P_PID, pid_, &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
      info.si_pid != pid_) {
    return false;
  }
  kill(-pid_, SIGKILL);  // anything the child left in its group
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &status, 0);
  } while (r < 0 && errno == EINTR);
  reaped_ = true;
  if (WIFEXITED(status)) {
    exit_status_ = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    exit_status_ = -WTERMSIG(status);
  } else {
    exit_status_ = -1;
  }
  return true;
}

bool Subprocess::Running() { return !TryReap(); }

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration poll = absl::Milliseconds(1);
  while (!TryReap()) {
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "pid ", pid_, " (", command_line_, ") still running after ",
          absl::FormatDuration(timeout)));
    }
    absl::SleepFor(std::min(poll, deadline - now));
    poll = std::min(poll * 2, absl::Milliseconds(10));
  }
  return exit_status_;
}

absl::Status Subprocess::Signal(int signal) {
  if (reaped_) return absl::OkStatus();
  if (kill(-pid_, signal) != 0 && errno != ESRCH) {
    return absl::InternalError(
        ErrnoMessage(absl::StrCat("kill -", signal, " -", pid_), errno));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Subprocess::Kill(absl::Duration grace) {
  if (TryReap()) return exit_status_;
  kill(-pid_, SIGTERM);
  absl::StatusOr<int> status = Wait(grace);
  if (status.ok()) return status;
  kill(-pid_, SIGKILL);
  kill(pid_, SIGKILL);
  // SIGKILL cannot be caught; the bound only guards against a process stuck
  // in the kernel.
  return Wait(absl::Seconds(30));
}

std::string Subprocess::ReadLog() const {
  std::ifstream in(log_path_, std::ios::binary);
  if (!in) return "";
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string Subprocess::LogTail(size_t max_bytes) const {
  std::string log = ReadLog();
  if (log.size() > max_bytes) log = "..." + log.substr(log.size() - max_bytes);
  return log;
}

absl::StatusOr<ServerProcess> StartPsServer(
    int shard_index, int num_shards, const std::vector<std::string>& extra_args,
    absl::Duration timeout, int port) {
  const std::string stem =
      UniqueTmpPath(absl::StrCat("ps_server_", shard_index));
  const std::string port_file = stem + ".port";
  std::vector<std::string> args = {
      absl::StrCat("--port=", port),
      absl::StrCat("--port_file=", port_file),
      absl::StrCat("--shard_index=", shard_index),
      absl::StrCat("--num_shards=", num_shards),
  };
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  absl::StatusOr<std::unique_ptr<Subprocess>> proc =
      Subprocess::Start(RunfilePath("server/ps_server"), args, stem + ".log");
  if (!proc.ok()) return proc.status();

  absl::StatusOr<int> bound = WaitForPortFile(
      port_file, proc->get(), timeout, absl::StrCat("shard ", shard_index));
  if (!bound.ok()) return bound.status();
  ServerProcess server;
  server.process = *std::move(proc);
  server.address = absl::StrCat("127.0.0.1:", *bound);
  return server;
}

absl::StatusOr<int> WaitForPortFile(const std::string& port_file,
                                    Subprocess* process, absl::Duration timeout,
                                    absl::string_view what) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    std::ifstream in(port_file);
    std::string content((std::istreambuf_iterator<char>(in)),
                        std::istreambuf_iterator<char>());
    const size_t newline = content.find('\n');
    if (newline != std::string::npos) {
      int port = 0;
      if (!absl::SimpleAtoi(
              absl::StripAsciiWhitespace(content.substr(0, newline)), &port) ||
          port <= 0 || port > 65535) {
        return absl::InternalError(absl::StrCat(what, ": port file ", port_file,
                                                " holds no port: '", content,
                                                "'"));
      }
      return port;
    }
    if (!process->Running()) {
      absl::StatusOr<int> code = process->Wait(absl::ZeroDuration());
      return absl::InternalError(
          absl::StrCat(what, " (", process->command_line(),
                       ") exited with status ", code.ok() ? *code : -1,
                       " before writing its port; log:\n", process->LogTail()));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          what, " (", process->command_line(), ") wrote no port to ", port_file,
          " within ", absl::FormatDuration(timeout), "; log:\n",
          process->LogTail()));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

absl::StatusOr<std::vector<ServerProcess>> StartPsCluster(
    int num_shards, const std::vector<std::string>& extra_args,
    absl::Duration timeout) {
  std::vector<ServerProcess> servers;
  for (int i = 0; i < num_shards; ++i) {
    absl::StatusOr<ServerProcess> s =
        StartPsServer(i, num_shards, extra_args, timeout);
    if (!s.ok()) return s.status();  // the ones started are killed on return
    servers.push_back(*std::move(s));
  }
  return servers;
}

std::string ServerList(const std::vector<ServerProcess>& servers) {
  std::vector<std::string> addresses;
  for (const ServerProcess& s : servers) addresses.push_back(s.address);
  return absl::StrJoin(addresses, ",");
}

absl::StatusOr<ToolRun> RunTool(absl::string_view relative,
                                const std::vector<std::string>& args,
                                absl::Duration timeout) {
  absl::StatusOr<std::unique_ptr<Subprocess>> p =
      Subprocess::Start(RunfilePath(relative), args);
  if (!p.ok()) return p.status();
  absl::StatusOr<int> code = (*p)->Wait(timeout);
  if (!code.ok()) return code.status();
  return ToolRun{*code, (*p)->ReadLog()};
}

absl::StatusOr<std::string> UnusedLoopbackAddress() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  const bool ok =
      bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  const int err = errno;
  close(fd);
  if (!ok) {
    return absl::InternalError(
        absl::StrCat("binding a loopback port: ", std::strerror(err)));
  }
  return absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
}

int ExitStatusInChild(const std::function<int()>& body) {
  const pid_t child = fork();
  if (child < 0) return -1;
  if (child == 0) _exit(body());
  int status = 0;
  pid_t waited;
  do {
    waited = waitpid(child, &status, 0);
  } while (waited < 0 && errno == EINTR);
  if (waited != child) return -1;
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

bool LoopbackPortBindable(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const int one = 1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok =
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
      bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      listen(fd, 4) == 0;
  close(fd);
  return ok;
}

absl::StatusOr<ProcessResources> ReadProcessResources(pid_t pid) {
  ProcessResources r;
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string key;
  bool rss = false, threads = false;
  while (status >> key) {
    if (key == "VmRSS:") {
      int64_t kb = 0;
      rss = static_cast<bool>(status >> kb);
      r.rss_bytes = kb * 1024;
    } else if (key == "VmHWM:") {
      int64_t kb = 0;
      if (status >> kb) r.peak_rss_bytes = kb * 1024;
    } else if (key == "Threads:") {
      threads = static_cast<bool>(status >> r.threads);
    }
  }
  // /proc/<pid>/stat: fields 10 (minflt), 14 and 15 (utime, stime, in
  // clock ticks) count from the one after the parenthesised command name,
  // which may hold spaces.
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  std::getline(stat, line);
  const size_t close = line.rfind(')');
  double utime = 0, stime = 0;
  std::vector<std::string> f;
  if (close != std::string::npos && close + 2 <= line.size()) {
    f = absl::StrSplit(line.substr(close + 2), ' ', absl::SkipEmpty());
  }
  if (!rss || !threads || f.size() < 13 || !absl::SimpleAtod(f[11], &utime) ||
      !absl::SimpleAtod(f[12], &stime) ||
      !absl::SimpleAtoi(f[7], &r.minor_faults)) {
    return absl::NotFoundError(
        absl::StrCat("cannot read /proc/", pid, " (process gone?)"));
  }
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  r.cpu_seconds = (utime + stime) / tick;
  r.system_seconds = stime / tick;
  return r;
}

}  // namespace testing
}  // namespace asyncps
