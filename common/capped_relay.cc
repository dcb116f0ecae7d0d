#include "common/capped_relay.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <list>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace asyncps {
namespace {

// Bytes buffered per direction of a connection.
constexpr size_t kBufferBytes = 64 << 10;

// A bound, listening, non-blocking socket for host:port; its port in *bound.
absl::StatusOr<int> Listen(const std::string& host, int port, int* bound) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(port);
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(),
                  &hints, &found) != 0 ||
      found == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", host));
  }
  int fd =
      socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const int one = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const bool ok = fd >= 0 && bind(fd, found->ai_addr, found->ai_addrlen) == 0 &&
                  listen(fd, SOMAXCONN) == 0;
  freeaddrinfo(found);
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (!ok || getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", host, ":", port,
                     " (address in use or not available?)"));
  }
  *bound = ntohs(addr.ss_family == AF_INET6
                     ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                     : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  return fd;
}

// A connection to 127.0.0.1:port, non-blocking once connected; -1 on error.
int ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

// One relayed connection: the caller's socket and the backend's.
struct Pair {
  int client = -1, backend = -1;
  std::string to_backend, to_client;
  int64_t from_client = 0;
  absl::Time opened, last;
  bool backend_done = false;  // closed by the backend: flush, then end
  bool ended = false;

  Pair() = default;
  Pair(const Pair&) = delete;
  Pair& operator=(const Pair&) = delete;
  ~Pair() {
    if (client >= 0) close(client);
    if (backend >= 0) close(backend);
  }
};

// Reads what `from` has into *buffer (up to kBufferBytes); false on EOF or
// an error.
bool ReadInto(int from, std::string* buffer, int64_t* count) {
  char chunk[16 << 10];
  while (buffer->size() < kBufferBytes) {
    const ssize_t n = recv(from, chunk, sizeof(chunk), 0);
    if (n > 0) {
      buffer->append(chunk, n);
      *count += n;
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      return true;
    } else {
      return false;
    }
  }
  return true;
}

// Writes what it can of *buffer to `to`; false on an error.
bool WriteFrom(std::string* buffer, int to) {
  while (!buffer->empty()) {
    const ssize_t n = send(to, buffer->data(), buffer->size(), MSG_NOSIGNAL);
    if (n > 0) {
      buffer->erase(0, n);
    } else {
      return n < 0 && (errno == EAGAIN || errno == EINTR);
    }
  }
  return true;
}

// Moves bytes both ways as poll reported; marks the pair ended when it is.
void Relay(const pollfd& c, const pollfd& b, int64_t max_client_bytes,
           Pair* p) {
  int64_t unused = 0;
  const int64_t before = p->from_client;
  if ((c.revents & (POLLIN | POLLHUP | POLLERR)) &&
      !ReadInto(p->client, &p->to_backend, &p->from_client)) {
    p->ended = true;
  }
  if ((b.revents & (POLLIN | POLLHUP | POLLERR)) &&
      !ReadInto(p->backend, &p->to_client, &unused)) {
    p->backend_done = true;
  }
  if (p->from_client > max_client_bytes) p->ended = true;
  if (!WriteFrom(&p->to_backend, p->backend)) p->ended = true;
  if (!WriteFrom(&p->to_client, p->client)) p->ended = true;
  if (p->backend_done && p->to_client.empty()) p->ended = true;
  if (p->from_client != before || unused > 0) p->last = absl::Now();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CappedRelay>> CappedRelay::Start(
    const std::string& host, int port, int backend_port,
    const CappedRelayOptions& options) {
  int bound = 0;
  absl::StatusOr<int> fd = Listen(host, port, &bound);
  if (!fd.ok()) return fd.status();
  int wake[2];
  if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    close(*fd);
    return absl::InternalError("pipe2() failed");
  }
  std::unique_ptr<CappedRelay> relay(
      new CappedRelay(*fd, bound, backend_port, wake[0], wake[1], options));
  relay->thread_ = std::thread([r = relay.get()] { r->Loop(); });
  return relay;
}

CappedRelay::CappedRelay(int listen_fd, int port, int backend_port,
                         int wake_read, int wake_write,
                         const CappedRelayOptions& options)
    : listen_fd_(listen_fd),
      port_(port),
      backend_port_(backend_port),
      wake_read_(wake_read),
      wake_write_(wake_write),
      options_(options) {}

CappedRelay::~CappedRelay() {
  Stop();
  close(listen_fd_);
  close(wake_read_);
  close(wake_write_);
}

void CappedRelay::Stop() {
  std::call_once(stopped_, [this] {
    const char byte = 0;
    while (write(wake_write_, &byte, 1) < 0 && errno == EINTR) {
    }
    if (thread_.joinable()) thread_.join();
  });
}

void CappedRelay::Loop() {
  std::list<Pair> pairs;
  std::vector<pollfd> fds;
  for (;;) {
    fds.assign({{wake_read_, POLLIN, 0}, {listen_fd_, POLLIN, 0}});
    for (const Pair& p : pairs) {
      const auto room = [](const std::string& s) {
        return s.size() < kBufferBytes ? POLLIN : 0;
      };
      fds.push_back({p.client,
                     static_cast<int16_t>(room(p.to_backend) |
                                          (p.to_client.empty() ? 0 : POLLOUT)),
                     0});
      fds.push_back(
          {p.backend,
           static_cast<int16_t>((p.backend_done ? 0 : room(p.to_client)) |
                                (p.to_backend.empty() ? 0 : POLLOUT)),
           0});
    }
    if (poll(fds.data(), fds.size(), 1000) < 0 && errno != EINTR) return;
    if (fds[0].revents != 0) return;  // Stop()
    size_t i = 2;
    const absl::Time now = absl::Now();
    for (auto it = pairs.begin(); it != pairs.end(); i += 2) {
      Relay(fds[i], fds[i + 1], options_.max_client_bytes, &*it);
      if (it->ended || now - it->last > options_.idle ||
          now - it->opened > options_.lifetime) {
        it = pairs.erase(it);
      } else {
        ++it;
      }
    }
    if (fds[1].revents & POLLIN) {
      for (;;) {
        const int client =
            accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (client < 0) break;
        const int backend =
            static_cast<int>(pairs.size()) < options_.max_connections
                ? ConnectLoopback(backend_port_)
                : -1;
        if (backend < 0) {
          close(client);
          continue;
        }
        Pair& p = pairs.emplace_back();
        p.client = client;
        p.backend = backend;
        p.opened = p.last = absl::Now();
      }
    }
  }
}

}  // namespace asyncps
