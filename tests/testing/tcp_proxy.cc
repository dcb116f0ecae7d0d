#include "tests/testing/tcp_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/call_ledger.h"

namespace asyncps {
namespace testing {

class TcpProxy::Impl {
 public:
  Impl(TcpProxy* owner, int listen_fd, int port, sockaddr_in backend)
      : owner_(owner), listen_fd_(listen_fd), port_(port), backend_(backend) {
    if (pipe(wake_) != 0) wake_[0] = wake_[1] = -1;
    thread_ = std::thread([this] { Loop(); });
  }
  ~Impl() {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
    }
    Wake();
    thread_.join();
    for (Pair& p : pairs_) ClosePair(&p, /*reset=*/false);
    close(listen_fd_);
    close(wake_[0]);
    close(wake_[1]);
  }

  int port() const { return port_; }

  void LoseNextAnswers(int times, int64_t min_request_bytes) {
    absl::MutexLock l(&mu_);
    lose_times_ = times;
    lose_min_bytes_ = min_request_bytes;
    sent_since_armed_ = 0;
  }
  void SetHeld(bool held) {
    {
      absl::MutexLock l(&mu_);
      held_ = held;
    }
    Wake();
  }
  void ResetAll() {
    {
      absl::MutexLock l(&mu_);
      reset_all_ = true;
    }
    Wake();
  }

 private:
  struct Pair {
    int client = -1;
    int backend = -1;
    // The client's HTTP/2 frames, counted as they pass.
    std::shared_ptr<CallLedger> frames = std::make_shared<CallLedger>();
  };

  void Wake() {
    const char c = 0;
    if (wake_[1] >= 0) (void)!write(wake_[1], &c, 1);
  }

  static void ClosePair(Pair* p, bool reset) {
    for (int fd : {p->client, p->backend}) {
      if (fd < 0) continue;
      if (reset) {
        linger lg{1, 0};  // RST instead of FIN
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
      }
      close(fd);
    }
    p->client = p->backend = -1;
  }

  // Moves what `from` has to `to`, passing it through `frames` when given;
  // false when either side is gone.
  bool Forward(int from, int to, int64_t* moved, CallLedger* frames) {
    char buf[64 << 10];
    const ssize_t n = read(from, buf, sizeof(buf));
    if (n <= 0) return false;
    if (frames != nullptr) {
      const uint64_t idle = frames->client_idle_frames();
      const uint64_t work = frames->client_work_frames();
      frames->FromClient(buf, static_cast<size_t>(n));
      const uint64_t new_work = frames->client_work_frames() - work;
      owner_->work_frames_.fetch_add(new_work);
      if (new_work == 0 && frames->client_idle_frames() > idle) {
        owner_->idle_only_reads_.fetch_add(1);
      }
    }
    ssize_t off = 0;
    while (off < n) {
      // MSG_NOSIGNAL: a peer that closed gives EPIPE here, not a SIGPIPE
      // that would kill the test process.
      const ssize_t w = send(to, buf + off, n - off, MSG_NOSIGNAL);
      if (w < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN) {
          pollfd p{to, POLLOUT, 0};
          poll(&p, 1, 1000);
          continue;
        }
        return false;
      }
      off += w;
    }
    *moved = n;
    return true;
  }

  void Loop() {
    for (;;) {
      bool held, reset_all;
      {
        absl::MutexLock l(&mu_);
        if (stop_) return;
        held = held_;
        reset_all = reset_all_;
        reset_all_ = false;
      }
      if (reset_all) {
        for (Pair& p : pairs_) ClosePair(&p, /*reset=*/true);
        pairs_.clear();
      }
      std::vector<pollfd> fds;
      fds.push_back({wake_[0], POLLIN, 0});
      if (!held) {
        fds.push_back({listen_fd_, POLLIN, 0});
        for (const Pair& p : pairs_) {
          fds.push_back({p.client, POLLIN, 0});
          fds.push_back({p.backend, POLLIN, 0});
        }
      }
      if (poll(fds.data(), fds.size(), 200) < 0 && errno != EINTR) return;
      if (fds[0].revents & POLLIN) {
        char drain[64];
        (void)!read(wake_[0], drain, sizeof(drain));
      }
      if (held) continue;
      // Only the pairs polled above have entries in fds (Accept adds one).
      const size_t polled = pairs_.size();
      if (fds[1].revents & POLLIN) Accept();
      bool cut = false;
      for (size_t i = 0; i < polled && !cut; ++i) {
        Pair& p = pairs_[i];
        const short from_client = fds[2 + 2 * i].revents;
        const short from_backend = fds[3 + 2 * i].revents;
        int64_t moved = 0;
        if (from_client & (POLLIN | POLLHUP | POLLERR)) {
          if (!Forward(p.client, p.backend, &moved, p.frames.get())) {
            ClosePair(&p, false);
            continue;
          }
          absl::MutexLock l(&mu_);
          if (lose_times_ > 0) sent_since_armed_ += moved;
        }
        if (from_backend & (POLLIN | POLLHUP | POLLERR)) {
          {
            absl::MutexLock l(&mu_);
            if (lose_times_ > 0 && sent_since_armed_ >= lose_min_bytes_) {
              --lose_times_;
              sent_since_armed_ = 0;
              cut = true;
            }
          }
          if (cut) {
            owner_->lost_.fetch_add(1);
            break;
          }
          if (!Forward(p.backend, p.client, &moved, nullptr)) {
            ClosePair(&p, false);
          }
        }
      }
      if (cut) {
        for (Pair& p : pairs_) ClosePair(&p, /*reset=*/true);
        pairs_.clear();
      }
      std::vector<Pair> live;
      for (const Pair& p : pairs_) {
        if (p.client >= 0) live.push_back(p);
      }
      pairs_.swap(live);
    }
  }

  void Accept() {
    const int client = accept(listen_fd_, nullptr, nullptr);
    if (client < 0) return;
    const int backend = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (backend < 0 ||
        connect(backend, reinterpret_cast<const sockaddr*>(&backend_),
                sizeof(backend_)) != 0) {
      close(client);
      if (backend >= 0) close(backend);
      return;
    }
    const int one = 1;
    setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(backend, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    pairs_.push_back(Pair{client, backend});
    owner_->accepted_.fetch_add(1);
  }

  TcpProxy* const owner_;
  const int listen_fd_;
  const int port_;
  const sockaddr_in backend_;
  int wake_[2];
  std::vector<Pair> pairs_;  // only the thread touches it
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  bool reset_all_ ABSL_GUARDED_BY(mu_) = false;
  int lose_times_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t lose_min_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t sent_since_armed_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

TcpProxy::TcpProxy(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TcpProxy::~TcpProxy() = default;

absl::StatusOr<std::unique_ptr<TcpProxy>> TcpProxy::Start(
    const std::string& backend) {
  const size_t colon = backend.rfind(':');
  int backend_port = 0;
  sockaddr_in to{};
  to.sin_family = AF_INET;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(backend.substr(colon + 1), &backend_port) ||
      inet_pton(AF_INET, backend.substr(0, colon).c_str(), &to.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("TcpProxy: backend '", backend, "' is not ip:port"));
  }
  to.sin_port = htons(static_cast<uint16_t>(backend_port));
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) ||
      listen(fd, 64) ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len)) {
    const int err = errno;
    if (fd >= 0) close(fd);
    return absl::ErrnoToStatus(err, "TcpProxy: cannot listen");
  }
  std::unique_ptr<TcpProxy> proxy(new TcpProxy(nullptr));
  proxy->impl_ =
      std::make_unique<Impl>(proxy.get(), fd, ntohs(addr.sin_port), to);
  return proxy;
}

std::string TcpProxy::address() const {
  return absl::StrCat("127.0.0.1:", impl_->port());
}

void TcpProxy::LoseNextAnswers(int times, int64_t min_request_bytes) {
  impl_->LoseNextAnswers(times, min_request_bytes);
}
void TcpProxy::Hold() { impl_->SetHeld(true); }
void TcpProxy::Release() { impl_->SetHeld(false); }
void TcpProxy::ResetAll() { impl_->ResetAll(); }

}  // namespace testing
}  // namespace asyncps
