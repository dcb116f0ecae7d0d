#include "common/http_connections.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/time/clock.h"

namespace asyncps {
namespace {

// Set while a refused connection runs on the accepting thread.
thread_local bool refusing = false;

// Waits up to `timeout` for `events` on `sock`; false on timeout or error.
bool WaitFor(int sock, short events, absl::Duration timeout) {
  pollfd p{sock, events, 0};
  const int ms = static_cast<int>(absl::ToInt64Milliseconds(timeout));
  int n;
  do {
    n = poll(&p, 1, ms);
  } while (n < 0 && errno == EINTR);
  return n > 0 && (p.revents & (events | POLLHUP | POLLERR)) != 0;
}

void AddressOf(int sock, bool peer, std::string* ip, int* port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  const int rc =
      peer ? getpeername(sock, reinterpret_cast<sockaddr*>(&addr), &len)
           : getsockname(sock, reinterpret_cast<sockaddr*>(&addr), &len);
  ip->clear();
  *port = 0;
  if (rc != 0) return;
  char host[NI_MAXHOST];
  char serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host),
                  serv, sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
    *ip = host;
    *port = std::atoi(serv);
  }
}

// A connected socket as httplib reads and writes requests: each read and
// write waits at most its timeout; reads come through a small buffer
// (httplib reads a request's head a byte at a time).
class ConnectionStream : public httplib::Stream {
 public:
  ConnectionStream(int sock, absl::Duration read_timeout,
                   absl::Duration write_timeout)
      : sock_(sock),
        read_timeout_(read_timeout),
        write_timeout_(write_timeout) {}

  bool is_readable() const override {
    return buffered() || WaitFor(sock_, POLLIN, read_timeout_);
  }
  bool buffered() const { return begin_ < end_; }
  bool is_writable() const override {
    return WaitFor(sock_, POLLOUT, write_timeout_);
  }

  ssize_t read(char* ptr, size_t size) override {
    if (begin_ == end_) {
      if (!WaitFor(sock_, POLLIN, read_timeout_)) return -1;
      ssize_t n;
      do {
        n = recv(sock_, buffer_, sizeof(buffer_), 0);
      } while (n < 0 && errno == EINTR);
      if (n <= 0) return n;
      begin_ = 0;
      end_ = static_cast<size_t>(n);
    }
    const size_t n = std::min(size, end_ - begin_);
    std::memcpy(ptr, buffer_ + begin_, n);
    begin_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!WaitFor(sock_, POLLOUT, write_timeout_)) return -1;
    ssize_t n;
    do {
      n = send(sock_, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    AddressOf(sock_, /*peer=*/true, &ip, &port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    AddressOf(sock_, /*peer=*/false, &ip, &port);
  }
  socket_t socket() const override { return sock_; }

 private:
  const int sock_;
  const absl::Duration read_timeout_;
  const absl::Duration write_timeout_;
  char buffer_[4096];
  size_t begin_ = 0;
  size_t end_ = 0;
};

// Answers a connection past the cap without waiting on it: 503, what the
// client already sent read away (closing over unread data would reset the
// connection before the answer arrives), closed.
void Refuse(int sock) {
  static constexpr char kAnswer[] =
      "HTTP/1.1 503 Service Unavailable\r\n"
      "Connection: close\r\n"
      "Content-Type: text/plain\r\n"
      "Content-Length: 34\r\n"
      "\r\n"
      "too many connections; retry later\n";
  (void)send(sock, kAnswer, sizeof(kAnswer) - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
  shutdown(sock, SHUT_WR);
  char sink[4096];
  for (int i = 0; i < 16; ++i) {
    if (recv(sock, sink, sizeof(sink), MSG_DONTWAIT) <= 0) break;
  }
  close(sock);
}

// httplib's task queue for one listen: every accepted connection goes
// through the gate.
class GateQueue : public httplib::TaskQueue {
 public:
  explicit GateQueue(std::shared_ptr<HttpConnectionGate> gate)
      : gate_(std::move(gate)) {}
  void enqueue(std::function<void()> fn) override { gate_->Run(std::move(fn)); }
  void shutdown() override { gate_->Shutdown(); }

 private:
  const std::shared_ptr<HttpConnectionGate> gate_;
};

}  // namespace

HttpConnectionGate::HttpConnectionGate(HttpConnectionLimits limits)
    : limits_(limits),
      threads_(limits.max_connections),
      reaper_([this] { ReapLoop(); }) {}

HttpConnectionGate::~HttpConnectionGate() { Shutdown(); }

void HttpConnectionGate::Run(std::function<void()> serve) {
  if (threads_.TryRun(serve)) return;
  // At the cap (or shut down): refused on this thread.
  refusing = true;
  serve();
  refusing = false;
}

bool HttpConnectionGate::Admit(int sock) {
  if (refusing) return false;
  absl::MutexLock l(&mu_);
  if (shut_down_) return false;
  deadlines_[sock] = absl::Now() + limits_.max_lifetime;
  return true;
}

void HttpConnectionGate::Close(int sock) {
  absl::MutexLock l(&mu_);
  // Under the lock: the reaper never shuts down a number reused since.
  deadlines_.erase(sock);
  shutdown(sock, SHUT_RDWR);
  close(sock);
}

void HttpConnectionGate::Shutdown() {
  bool first = false;
  {
    absl::MutexLock l(&mu_);
    if (!shut_down_) {
      shut_down_ = true;
      first = true;
      for (const auto& [sock, deadline] : deadlines_) {
        shutdown(sock, SHUT_RDWR);
      }
    }
  }
  threads_.Shutdown();
  if (first && reaper_.joinable()) reaper_.join();
}

int HttpConnectionGate::active() const { return threads_.running(); }

void HttpConnectionGate::ReapLoop() {
  absl::MutexLock l(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&shut_down_),
                               absl::Milliseconds(250))) {
    const absl::Time now = absl::Now();
    for (auto& [sock, deadline] : deadlines_) {
      if (deadline <= now) {
        shutdown(sock, SHUT_RDWR);
        deadline = absl::InfiniteFuture();
      }
    }
  }
}

GatedHttpServer::GatedHttpServer(HttpConnectionLimits limits)
    : gate_(std::make_shared<HttpConnectionGate>(limits)) {
  new_task_queue = [gate = gate_] { return new GateQueue(gate); };
}

GatedHttpServer::~GatedHttpServer() = default;

bool GatedHttpServer::SetBacklog(int backlog) {
  const int sock = svr_sock_;
  return sock >= 0 && ::listen(sock, backlog) == 0;
}

bool GatedHttpServer::process_and_close_socket(socket_t sock) {
  if (!gate_->Admit(sock)) {
    Refuse(sock);
    return false;
  }
  const auto seconds = [](time_t s, time_t us) {
    return absl::Seconds(s) + absl::Microseconds(us);
  };
  ConnectionStream stream(sock, seconds(read_timeout_sec_, read_timeout_usec_),
                          seconds(write_timeout_sec_, write_timeout_usec_));
  bool ok = false;
  for (size_t left = keep_alive_max_count_; left > 0; --left) {
    // An idle connection ends after the keep-alive timeout.
    if (!stream.buffered() &&
        !WaitFor(sock, POLLIN, absl::Seconds(keep_alive_timeout_sec_))) {
      break;
    }
    bool closed = false;
    ok = process_request(stream, /*close_connection=*/left == 1, closed,
                         nullptr);
    if (!ok || closed) break;
  }
  gate_->Close(sock);
  return ok;
}

}  // namespace asyncps
