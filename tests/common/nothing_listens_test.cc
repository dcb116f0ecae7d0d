// NothingListens (common/connection_check.h), which a primary uses to tell
// a dead backup from a slow one, and a backup a dead primary from a live
// one: true only when the host refused the connection (nothing listens at
// that port), false for a listening socket, for a backlog that is full,
// and for an address that is not host:port.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/connection_check.h"

namespace asyncps {
namespace {

constexpr absl::Duration kTimeout = absl::Milliseconds(200);

// A TCP socket bound to a free loopback port; listening when asked.
struct Bound {
  int fd = -1;
  int port = 0;
  explicit Bound(bool listening, int backlog = 16) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    socklen_t len = sizeof(a);
    REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port = ntohs(a.sin_port);
    if (listening) REQUIRE(listen(fd, backlog) == 0);
  }
  ~Bound() { Close(); }
  void Close() {
    if (fd >= 0) close(fd);
    fd = -1;
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port); }
};

TEST_CASE("a listening port is not taken for a dead process; a closed one is",
          "[net]") {
  Bound server(/*listening=*/true);
  CHECK_FALSE(NothingListens(server.address(), kTimeout));
  server.Close();
  CHECK(NothingListens(server.address(), kTimeout));
  // Bound but not listening (a process between bind and listen, or whose
  // listener closed): the kernel refuses too.
  Bound unlistened(/*listening=*/false);
  CHECK(NothingListens(unlistened.address(), kTimeout));
}

TEST_CASE("a listener whose backlog is full is not taken for a dead one",
          "[net]") {
  // A stopped (SIGSTOP) or overloaded process accepts nothing, but the
  // kernel does not refuse its connections: they wait (or time out).
  Bound server(/*listening=*/true, /*backlog=*/0);
  for (int i = 0; i < 8; ++i) {
    CHECK_FALSE(NothingListens(server.address(), kTimeout));
  }
}

TEST_CASE("an address that is not host:port is not taken for a dead process",
          "[net]") {
  CHECK_FALSE(NothingListens("", kTimeout));
  CHECK_FALSE(NothingListens("127.0.0.1", kTimeout));
  CHECK_FALSE(NothingListens(":80", kTimeout));
}

}  // namespace
}  // namespace asyncps
