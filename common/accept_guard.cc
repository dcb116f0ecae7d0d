#include "common/accept_guard.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>

namespace asyncps {
namespace {

// 0: the guard is off.
std::atomic<int> ceiling{0};
std::atomic<uint64_t> shed{0};
// Held open so that, at EMFILE, closing it makes room to accept (and
// close) a waiting connection.
std::atomic<int> spare{-1};

int RawAccept4(int sockfd, sockaddr* addr, socklen_t* addrlen, int flags) {
  return static_cast<int>(syscall(SYS_accept4, sockfd, addr, addrlen, flags));
}

// At EMFILE: closes the connections waiting on `sockfd` (up to a bound),
// using the spare descriptor's room for each.
void ShedWaiting(int sockfd) {
  const int held = spare.exchange(-1);
  if (held < 0) return;
  close(held);
  for (int i = 0; i < 256; ++i) {
    const int fd = RawAccept4(sockfd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) break;
    close(fd);
    shed.fetch_add(1, std::memory_order_relaxed);
  }
  spare.store(open("/dev/null", O_RDONLY | O_CLOEXEC));
}

}  // namespace

AcceptGuardReport GuardAccepts(int reserve) {
  AcceptGuardReport report;
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return report;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  report.soft_limit = limit.rlim_cur;
  report.hard_limit = limit.rlim_max;
  if (limit.rlim_cur == RLIM_INFINITY) return report;
  const uint64_t soft = limit.rlim_cur;
  // Small limits keep at least a quarter for connections.
  const uint64_t keep = std::min<uint64_t>(reserve, soft / 4);
  report.ceiling = static_cast<int>(std::min<uint64_t>(soft - keep, 1 << 30));
  if (spare.load() < 0) spare.store(open("/dev/null", O_RDONLY | O_CLOEXEC));
  ceiling.store(report.ceiling);
  return report;
}

uint64_t ConnectionsShed() { return shed.load(std::memory_order_relaxed); }

}  // namespace asyncps

// The process's accept4 (gRPC's listeners call it through the PLT).
extern "C" int accept4(int sockfd, sockaddr* addr, socklen_t* addrlen,
                       int flags) {
  using asyncps::ceiling;
  using asyncps::shed;
  for (;;) {
    const int fd = asyncps::RawAccept4(sockfd, addr, addrlen, flags);
    const int top = ceiling.load(std::memory_order_relaxed);
    if (top == 0) return fd;
    if (fd >= top) {
      // The lowest free descriptor is among the reserved ones: every one
      // below is taken. Refuse this connection, try the next.
      close(fd);
      shed.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
      asyncps::ShedWaiting(sockfd);
      errno = EAGAIN;  // gRPC then waits for the next connection
    }
    return fd;
  }
}
