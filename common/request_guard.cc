#include "common/request_guard.h"

#include <dlfcn.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/call_ledger.h"

namespace asyncps {
namespace {

// Descriptors at or above this pass through unguarded.
constexpr int kMaxFd = 1 << 20;
constexpr int kMaxPorts = 8;

enum : uint8_t { kUnknown = 0, kPassThrough = 1, kGuarded = 2 };

// Per descriptor: kUnknown until its first read classifies it.
std::atomic<uint8_t> fd_state[kMaxFd];
std::atomic<bool> enabled{false};
std::atomic<uint64_t> shut_total{0};
std::atomic<uint64_t> floods_total{0};

// A client that resets more calls than this within a second is flooding
// ("rapid reset", CVE-2023-44487: gRPC 1.51 does the work of every call it
// opens, and holds memory for it, whether or not the client keeps it).
constexpr uint64_t kMaxResetsPerSecond = 1000;
// Frames that do no call's work (CallLedger::client_idle_frames) beyond
// this within a second, plus four per frame that does: a flood. gRPC
// parses each at once; one connection sending WINDOW_UPDATE, PRIORITY or
// empty DATA frames (12 million a second) kept a shard's core busy for as
// long as it went on. A gRPC client sends a few per call at most.
constexpr uint64_t kMaxIdleFramesPerSecond = 10000;
// A header block larger than this is no gRPC call's (gRPC refuses metadata
// over 16 KiB), but gRPC 1.51 keeps reading CONTINUATION frames into it:
// one connection sending them took a shard to 3.4 GB in 8 s.
constexpr int64_t kMaxHeaderBlockBytes = 256 << 10;
// A header block in more frames than this is no gRPC call's either (a
// gRPC client sends metadata in one HEADERS frame, and 16 KiB frames
// would carry the largest block above in 16), and gRPC 1.51 copies the
// block read so far once per frame (CVE-2023-33953): one connection
// sending 1-byte CONTINUATION frames (7 MB on the wire) kept a shard at
// 1.2-1.5 cores for 12 s, 96% of it in memmove.
constexpr int kMaxHeaderBlockFrames = 32;

struct Port {
  int port = 0;
  int64_t max_bytes = 0;
  int64_t pending = 0;  // of its live guarded connections
  bool tls = false;     // read through SSL_read, not recvmsg
};

struct Connection {
  CallLedger calls;
  int port_index = 0;
  int fd = -1;        // -1: a TLS connection, known by its SSL object
  bool shut = false;  // shut down; no longer counted
  // The one-second window its resets and idle frames are counted in.
  absl::Time window_start = absl::InfinitePast();
  uint64_t resets_before_window = 0;
  uint64_t idle_before_window = 0;
  uint64_t work_before_window = 0;
};

absl::Mutex mu;
Port ports[kMaxPorts] ABSL_GUARDED_BY(mu);
int num_ports ABSL_GUARDED_BY(mu) = 0;
// The index in `ports` of the port whose connections speak TLS; -1: none.
int tls_port ABSL_GUARDED_BY(mu) = -1;
std::atomic<bool> tls_enabled{false};
absl::flat_hash_map<int, std::unique_ptr<Connection>>& Connections()
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  static auto* map = new absl::flat_hash_map<int, std::unique_ptr<Connection>>;
  return *map;
}
// TLS connections by their SSL object (server side).
absl::flat_hash_map<const SSL*, std::unique_ptr<Connection>>& TlsConnections()
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  static auto* map =
      new absl::flat_hash_map<const SSL*, std::unique_ptr<Connection>>;
  return *map;
}

int LocalPort(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return -1;
  if (addr.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  }
  if (addr.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  }
  return -1;
}

// The connection behind `fd`, classifying a new descriptor; null when it
// is not guarded (or was shut).
Connection* Find(int fd) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  if (fd_state[fd].load(std::memory_order_relaxed) == kUnknown) {
    const int local = LocalPort(fd);
    for (int i = 0; i < num_ports; ++i) {
      // A TLS port's bytes here are ciphertext; SSL_read sees its frames.
      if (ports[i].port == local && !ports[i].tls) {
        auto c = std::make_unique<Connection>();
        c->port_index = i;
        c->fd = fd;
        Connections()[fd] = std::move(c);
        fd_state[fd].store(kGuarded, std::memory_order_relaxed);
        break;
      }
    }
    if (fd_state[fd].load(std::memory_order_relaxed) == kUnknown) {
      fd_state[fd].store(kPassThrough, std::memory_order_relaxed);
      return nullptr;
    }
  }
  auto it = Connections().find(fd);
  if (it == Connections().end() || it->second->shut) return nullptr;
  return it->second.get();
}

// Shuts `c` down. A TCP connection: gRPC reads the end and closes the
// descriptor; with no linger that close resets the connection, so that the
// sender stops at once (a plain close left clients sending into a zero
// window for minutes). A TLS connection: its next SSL_read fails, which
// makes gRPC close it (the shard's keepalive pings bring one within 15 s).
void Shut(Connection* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  c->shut = true;
  ports[c->port_index].pending -= c->calls.pending();
  if (c->fd < 0) return;
  const linger abort{1, 0};
  setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &abort, sizeof(abort));
  shutdown(c->fd, SHUT_RDWR);
}

// Of `map`'s live connections on port `index`, the one holding the most if
// it holds more than *most.
template <typename Map>
void Heaviest(Map& map, int index, Connection** most) {
  for (auto& [key, c] : map) {
    if (c->shut || c->port_index != index) continue;
    if (*most == nullptr || c->calls.pending() > (*most)->calls.pending()) {
      *most = c.get();
    }
  }
}

// Shuts the connections of port `index` holding the most until the rest
// fit its budget.
void Shed(int index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  while (ports[index].pending > ports[index].max_bytes) {
    Connection* most = nullptr;
    if (ports[index].tls) {
      Heaviest(TlsConnections(), index, &most);
    } else {
      Heaviest(Connections(), index, &most);
    }
    if (most == nullptr) return;
    Shut(most);
    shut_total.fetch_add(1, std::memory_order_relaxed);
  }
}

// True when `c` reset more than kMaxResetsPerSecond calls, or sent more
// idle frames than allowed, in its current one-second window.
bool Flooding(Connection* c) {
  const CallLedger& l = c->calls;
  const uint64_t resets = l.client_resets() - c->resets_before_window;
  const uint64_t idle = l.client_idle_frames() - c->idle_before_window;
  const uint64_t idle_allowed =
      kMaxIdleFramesPerSecond +
      4 * (l.client_work_frames() - c->work_before_window);
  // The clock is read only once a window is half full.
  if (resets <= kMaxResetsPerSecond / 2 && idle <= idle_allowed / 2) {
    return false;
  }
  const absl::Time now = absl::Now();
  if (now - c->window_start > absl::Seconds(1)) {
    c->window_start = now;
    c->resets_before_window = l.client_resets();
    c->idle_before_window = l.client_idle_frames();
    c->work_before_window = l.client_work_frames();
    return false;
  }
  return resets > kMaxResetsPerSecond || idle > idle_allowed;
}

// Feeds `n` bytes at `data` that passed one way to c's ledger.
void Feed(Connection* c, const char* data, size_t n, bool received)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  const int64_t before = c->calls.pending();
  if (received) {
    c->calls.FromClient(data, n);
  } else {
    c->calls.FromServer(data, n);
  }
  ports[c->port_index].pending += c->calls.pending() - before;
}

// After bytes were fed to `c`: shuts it if its client floods, else sheds
// its port down to budget. True when `c` itself was shut by a flood (the
// bytes that made it are not handed to gRPC).
bool Judge(Connection* c, bool received) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  if (!received) return false;
  if (Flooding(c) || c->calls.header_block() > kMaxHeaderBlockBytes ||
      c->calls.header_block_frames() > kMaxHeaderBlockFrames) {
    Shut(c);
    floods_total.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  Shed(c->port_index);
  return false;
}

// Feeds the first `n` bytes of `msg`'s buffers to fd's ledger. True when
// those bytes got the connection shut: they are not handed to gRPC.
bool Saw(int fd, const msghdr* msg, size_t n, bool received) {
  if (fd < 0 || fd >= kMaxFd ||
      fd_state[fd].load(std::memory_order_relaxed) == kPassThrough) {
    return false;
  }
  absl::MutexLock lock(&mu);
  Connection* c = Find(fd);
  if (c == nullptr) return false;
  for (size_t i = 0; i < msg->msg_iovlen && n > 0; ++i) {
    const size_t part = std::min(n, msg->msg_iov[i].iov_len);
    Feed(c, static_cast<const char*>(msg->msg_iov[i].iov_base), part, received);
    n -= part;
  }
  if (c->calls.not_http2()) {
    // Not HTTP/2 in plain text (a TLS handshake on a port not declared
    // TLS, or no gRPC client): its bytes read as frames would cut healthy
    // connections at random, so it passes through; gRPC refuses what is
    // not HTTP/2 itself.
    ports[c->port_index].pending -= c->calls.pending();
    Connections().erase(fd);
    fd_state[fd].store(kPassThrough, std::memory_order_relaxed);
    return false;
  }
  return Judge(c, received);
}

// The server side of a TLS connection on the TLS port, created at its first
// bytes; null when it is not guarded, was shut, or is not HTTP/2.
Connection* FindTls(const SSL* ssl) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  auto it = TlsConnections().find(ssl);
  if (it == TlsConnections().end()) {
    if (tls_port < 0) return nullptr;
    auto c = std::make_unique<Connection>();
    c->port_index = tls_port;
    it = TlsConnections().emplace(ssl, std::move(c)).first;
  }
  Connection* c = it->second.get();
  return c->shut || c->calls.not_http2() ? nullptr : c;
}

// Plaintext `n` bytes at `data` through a server-side SSL object. True
// when the connection is (or was) shut: the read fails.
bool SawTls(const SSL* ssl, const void* data, size_t n, bool received) {
  absl::MutexLock lock(&mu);
  auto it = TlsConnections().find(ssl);
  if (it != TlsConnections().end() && it->second->shut) return true;
  Connection* c = FindTls(ssl);
  if (c == nullptr) return false;
  Feed(c, static_cast<const char*>(data), n, received);
  if (c->calls.not_http2()) {
    ports[c->port_index].pending -= c->calls.pending();
    return false;
  }
  // Shut by its own flood, or as the heaviest past the budget.
  return Judge(c, received) || c->shut;
}

void ForgetTls(const SSL* ssl) {
  absl::MutexLock lock(&mu);
  auto it = TlsConnections().find(ssl);
  if (it == TlsConnections().end()) return;
  Connection* c = it->second.get();
  if (!c->shut && !c->calls.not_http2()) {
    ports[c->port_index].pending -= c->calls.pending();
  }
  TlsConnections().erase(it);
}

// OpenSSL's own functions, which the ones below wrap.
template <typename F>
F Next(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}
using SslReadFn = int (*)(SSL*, void*, int);
using SslWriteFn = int (*)(SSL*, const void*, int);
using SslFreeFn = void (*)(SSL*);

// Forgets `fd` before it is closed, so that a shutdown never reaches a
// descriptor number reused for something else.
int Close(int fd) {
  if (fd >= 0 && fd < kMaxFd && enabled.load(std::memory_order_relaxed)) {
    const uint8_t state = fd_state[fd].load(std::memory_order_relaxed);
    if (state == kGuarded) {
      absl::MutexLock lock(&mu);
      auto it = Connections().find(fd);
      if (it != Connections().end()) {
        if (!it->second->shut) {
          ports[it->second->port_index].pending -= it->second->calls.pending();
        }
        Connections().erase(it);
      }
      fd_state[fd].store(kUnknown, std::memory_order_relaxed);
      return static_cast<int>(syscall(SYS_close, fd));
    }
    if (state != kUnknown) fd_state[fd].store(kUnknown);
  }
  return static_cast<int>(syscall(SYS_close, fd));
}

}  // namespace

void GuardUnfinishedRequests(int port, int64_t max_bytes, bool tls) {
  absl::MutexLock lock(&mu);
  for (int i = 0; i < num_ports; ++i) {
    if (ports[i].port == port) {
      ports[i].max_bytes = max_bytes;
      return;
    }
  }
  if (num_ports == kMaxPorts || (tls && tls_port >= 0)) return;
  if (tls) {
    tls_port = num_ports;
    tls_enabled.store(true);
  }
  ports[num_ports++] = {port, max_bytes, 0, tls};
  enabled.store(true);
  // Connections that read before the port was guarded are looked at again.
  for (std::atomic<uint8_t>& state : fd_state) {
    if (state.load(std::memory_order_relaxed) == kPassThrough) {
      state.store(kUnknown, std::memory_order_relaxed);
    }
  }
}

UnfinishedRequestStats UnfinishedRequests() {
  UnfinishedRequestStats stats;
  absl::MutexLock lock(&mu);
  for (int i = 0; i < num_ports; ++i) stats.pending_bytes += ports[i].pending;
  stats.connections_shut = shut_total.load(std::memory_order_relaxed);
  stats.floods_shut = floods_total.load(std::memory_order_relaxed);
  return stats;
}

}  // namespace asyncps

// The process's recvmsg, sendmsg and close (gRPC's endpoints call them
// through the PLT).
extern "C" ssize_t recvmsg(int fd, msghdr* msg, int flags) {
  const ssize_t r = syscall(SYS_recvmsg, fd, msg, flags);
  if (r > 0 && !(flags & (MSG_PEEK | MSG_ERRQUEUE)) &&
      asyncps::enabled.load(std::memory_order_relaxed) &&
      asyncps::Saw(fd, msg, static_cast<size_t>(r), /*received=*/true)) {
    // The flood stops here: gRPC sees the reset, not the frames that made
    // it (their parsing is the work the cut saves).
    errno = ECONNRESET;
    return -1;
  }
  return r;
}

extern "C" ssize_t sendmsg(int fd, const msghdr* msg, int flags) {
  const ssize_t r = syscall(SYS_sendmsg, fd, msg, flags);
  if (r > 0 && asyncps::enabled.load(std::memory_order_relaxed)) {
    (void)asyncps::Saw(fd, msg, static_cast<size_t>(r), /*received=*/false);
  }
  return r;
}

extern "C" int close(int fd) { return asyncps::Close(fd); }

// And OpenSSL's SSL_read, SSL_write and SSL_free, for the TLS port (gRPC's
// TLS endpoints call them through the PLT): the same ledger reads the
// plaintext of the server side's connections.
extern "C" int SSL_read(SSL* ssl, void* buf, int num) {
  static const auto next = asyncps::Next<asyncps::SslReadFn>("SSL_read");
  const int r = next(ssl, buf, num);
  if (r > 0 && asyncps::tls_enabled.load(std::memory_order_relaxed) &&
      SSL_is_server(ssl) == 1 &&
      asyncps::SawTls(ssl, buf, static_cast<size_t>(r), /*received=*/true)) {
    // gRPC sees a failed read (SSL_ERROR_SSL: it logs and drains the error
    // queue) and closes the connection.
    ERR_raise(ERR_LIB_SSL, SSL_R_EXCESSIVE_MESSAGE_SIZE);
    return -1;
  }
  return r;
}

extern "C" int SSL_write(SSL* ssl, const void* buf, int num) {
  static const auto next = asyncps::Next<asyncps::SslWriteFn>("SSL_write");
  const int r = next(ssl, buf, num);
  if (r > 0 && asyncps::tls_enabled.load(std::memory_order_relaxed) &&
      SSL_is_server(ssl) == 1) {
    (void)asyncps::SawTls(ssl, buf, static_cast<size_t>(r),
                          /*received=*/false);
  }
  return r;
}

extern "C" void SSL_free(SSL* ssl) {
  static const auto next = asyncps::Next<asyncps::SslFreeFn>("SSL_free");
  if (ssl != nullptr && asyncps::tls_enabled.load(std::memory_order_relaxed)) {
    asyncps::ForgetTls(ssl);
  }
  next(ssl);
}
