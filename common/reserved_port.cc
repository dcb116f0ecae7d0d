#include "common/reserved_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <utility>

namespace asyncps {

absl::StatusOr<ReservedPort> ReservedPort::Pick(const std::string& host) {
  // Close-on-exec: a process that starts over (execv) picks anew.
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket() failed");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    a.sin_addr.s_addr = htonl(INADDR_ANY);
  }
  socklen_t len = sizeof(a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(fd);
    return absl::UnavailableError("cannot find a free port on " + host);
  }
  ReservedPort r;
  r.fd_ = fd;
  r.port_ = ntohs(a.sin_port);
  return r;
}

ReservedPort::ReservedPort(ReservedPort&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), port_(other.port_) {}

ReservedPort& ReservedPort::operator=(ReservedPort&& other) noexcept {
  if (this != &other) {
    Release();
    fd_ = std::exchange(other.fd_, -1);
    port_ = other.port_;
  }
  return *this;
}

void ReservedPort::Release() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

}  // namespace asyncps
