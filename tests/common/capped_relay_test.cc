// CappedRelay against an echo server on loopback: bytes go both ways, a
// connection ends once its client sent its budget or stayed idle, and
// connections beyond the cap are closed as they come.

#include "common/capped_relay.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"

namespace asyncps {
namespace {

// Echoes every connection's bytes back, a thread per connection.
class EchoServer {
 public:
  EchoServer() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    REQUIRE(listen(fd_, 64) == 0);
    socklen_t len = sizeof(addr);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    accepting_ = std::thread([this] {
      for (;;) {
        const int c = accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        conns_.emplace_back([c] {
          char buf[4096];
          ssize_t n;
          while ((n = recv(c, buf, sizeof(buf), 0)) > 0) {
            send(c, buf, n, MSG_NOSIGNAL);
          }
          close(c);
        });
      }
    });
  }
  ~EchoServer() {
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    accepting_.join();
    for (std::thread& t : conns_) t.join();
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::thread accepting_;
  std::vector<std::thread> conns_;
};

int Dial(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  return fd;
}

// What arrives on `fd` within `wait`, up to `want` bytes; "<closed>" is
// appended when the peer closed.
std::string Receive(int fd, size_t want, absl::Duration wait) {
  std::string got;
  const absl::Time end = absl::Now() + wait;
  while (got.size() < want && absl::Now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return got + "<closed>";
    got.append(buf, n);
  }
  return got;
}

TEST_CASE("bytes go both ways through the relay", "[relay]") {
  EchoServer echo;
  auto relay = CappedRelay::Start("127.0.0.1", 0, echo.port(), {});
  REQUIRE(relay.ok());
  const int fd = Dial((*relay)->port());
  const std::string hello = "hello through the relay";
  REQUIRE(send(fd, hello.data(), hello.size(), 0) ==
          static_cast<ssize_t>(hello.size()));
  CHECK(Receive(fd, hello.size(), absl::Seconds(5)) == hello);
  close(fd);
}

TEST_CASE("a connection ends once its client sent more than its budget",
          "[relay]") {
  EchoServer echo;
  CappedRelayOptions o;
  o.max_client_bytes = 1000;
  auto relay = CappedRelay::Start("127.0.0.1", 0, echo.port(), o);
  REQUIRE(relay.ok());
  const int fd = Dial((*relay)->port());
  const std::string within(1000, 'a');
  send(fd, within.data(), within.size(), 0);
  CHECK(Receive(fd, within.size(), absl::Seconds(5)) == within);
  send(fd, "b", 1, MSG_NOSIGNAL);
  CHECK(Receive(fd, 1, absl::Seconds(5)) == "<closed>");
  close(fd);
}

TEST_CASE("connections beyond the cap are closed; idle ones end", "[relay]") {
  EchoServer echo;
  CappedRelayOptions o;
  o.max_connections = 2;
  o.idle = absl::Seconds(1);
  auto relay = CappedRelay::Start("127.0.0.1", 0, echo.port(), o);
  REQUIRE(relay.ok());
  const int a = Dial((*relay)->port());
  const int b = Dial((*relay)->port());
  send(a, "x", 1, 0);
  REQUIRE(Receive(a, 1, absl::Seconds(5)) == "x");  // both are relayed now
  send(b, "y", 1, 0);
  REQUIRE(Receive(b, 1, absl::Seconds(5)) == "y");
  const int third = Dial((*relay)->port());
  CHECK(Receive(third, 1, absl::Seconds(5)) == "<closed>");
  close(third);
  // Silent for longer than `idle`: ended, and their slots free again.
  CHECK(Receive(a, 1, absl::Seconds(5)) == "<closed>");
  CHECK(Receive(b, 1, absl::Seconds(5)) == "<closed>");
  const int later = Dial((*relay)->port());
  send(later, "z", 1, 0);
  CHECK(Receive(later, 1, absl::Seconds(5)) == "z");
  close(a);
  close(b);
  close(later);
  (*relay)->Stop();
}

}  // namespace
}  // namespace asyncps
