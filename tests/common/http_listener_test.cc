// The HTTP endpoint under connections that take without asking: idle ones,
// ones that trickle their request, more than it serves at once. Real
// sockets on loopback, real httplib clients.

#include "common/http_listener.h"

#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "catch2/catch.hpp"

namespace asyncps {
namespace {

// An open TCP connection to the listener; closed when it goes.
class RawConnection {
 public:
  explicit RawConnection(int port) : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ =
        connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    timeval tv{0, 200000};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~RawConnection() { close(fd_); }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  bool connected() const { return connected_; }
  bool Send(const std::string& bytes) {
    return send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }
  // What the server sent within 200 ms; `*closed` once it closed.
  std::string Receive(bool* closed) {
    char buffer[4096];
    const ssize_t n = recv(fd_, buffer, sizeof(buffer), 0);
    *closed = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
    return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : "";
  }

 private:
  const int fd_;
  bool connected_ = false;
};

// A listener whose "/" answers with the caller's address.
struct Endpoint {
  explicit Endpoint(HttpConnectionLimits limits)
      : listener("test", limits, [](httplib::Server* server) {
          server->Get(
              "/", [](const httplib::Request& req, httplib::Response& res) {
                res.set_content("hello " + req.remote_addr, "text/plain");
              });
        }) {
    absl::StatusOr<int> bound = listener.Start("127.0.0.1", 0);
    REQUIRE(bound.ok());
    port = *bound;
  }
  HttpListener listener;
  int port = 0;
};

// One GET on a new connection: the status (0: no answer) and the body.
std::pair<int, std::string> Get(int port, int timeout_s = 3) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(timeout_s);
  client.set_read_timeout(timeout_s);
  httplib::Result res = client.Get("/");
  if (!res) return {0, ""};
  return {res->status, res->body};
}

// Connections that send the start of a request and then nothing: each
// holds a connection of the listener until a timeout ends it.
std::vector<std::unique_ptr<RawConnection>> Stall(int port, int n) {
  std::vector<std::unique_ptr<RawConnection>> held;
  for (int i = 0; i < n; ++i) {
    held.push_back(std::make_unique<RawConnection>(port));
    REQUIRE(held.back()->connected());
    REQUIRE(held.back()->Send("GET / HTTP/1.1\r\nHost: x\r\n"));
  }
  return held;
}

// Waits (bounded) until the listener serves exactly `n` connections.
bool WaitActive(HttpListener& listener, int n) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (listener.active_connections() != n) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

TEST_CASE("stalled connections do not keep a request from its answer",
          "[http]") {
  Endpoint e(HttpConnectionLimits{64});
  auto held = Stall(e.port, 48);
  REQUIRE(WaitActive(e.listener, 48));
  // Answered within the client's 3 s deadline: a pool of a few threads
  // answered nothing here until the stalled requests' read timeouts (5 s
  // each, a pool's worth at a time).
  auto [status, body] = Get(e.port);
  CHECK(status == 200);
  CHECK(body == "hello 127.0.0.1");
}

TEST_CASE("a connection past the cap is answered 503 at once", "[http]") {
  Endpoint e(HttpConnectionLimits{4});
  auto held = Stall(e.port, 4);
  REQUIRE(WaitActive(e.listener, 4));
  auto [status, body] = Get(e.port);
  CHECK(status == 503);
  CHECK(absl::StrContains(body, "too many connections"));
  CHECK(e.listener.active_connections() == 4);
  // The held connections closed, requests are served again.
  held.clear();
  REQUIRE(WaitActive(e.listener, 0));
  CHECK(Get(e.port).first == 200);
}

TEST_CASE("a connection that trickles its request ends at its lifetime",
          "[http]") {
  Endpoint e(HttpConnectionLimits{8, absl::Seconds(2)});
  RawConnection slow(e.port);
  REQUIRE(slow.connected());
  REQUIRE(slow.Send("GET / HTTP/1.1\r\n"));
  // A header byte every 0.3 s: every read completes well within the read
  // timeout, so only the lifetime ends it.
  const absl::Time start = absl::Now();
  bool closed = false;
  std::string answer;
  while (!closed && absl::Now() - start < absl::Seconds(10)) {
    slow.Send("X");
    answer += slow.Receive(&closed);
    absl::SleepFor(absl::Milliseconds(100));
  }
  CHECK(closed);
  CHECK(answer.empty());
  CHECK(absl::Now() - start >= absl::Seconds(1.5));
  REQUIRE(WaitActive(e.listener, 0));
  CHECK(Get(e.port).first == 200);
}

TEST_CASE("keep-alive requests share a connection; Stop ends held ones",
          "[http]") {
  Endpoint e(HttpConnectionLimits{16});
  {
    httplib::Client client("127.0.0.1", e.port);
    client.set_keep_alive(true);
    for (int i = 0; i < 3; ++i) {
      httplib::Result res = client.Get("/");
      REQUIRE(res);
      CHECK(res->status == 200);
    }
    CHECK(e.listener.active_connections() == 1);
  }
  auto held = Stall(e.port, 8);
  REQUIRE(WaitActive(e.listener, 8));
  e.listener.Stop();
  CHECK(e.listener.active_connections() == 0);
  bool closed = false;
  held[0]->Receive(&closed);
  CHECK(closed);
}

}  // namespace
}  // namespace asyncps
