#include "tests/testing/raw_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace asyncps {
namespace testing {
namespace {

// Writes all of `data`; false once the peer closed or a send timed out.
bool SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n =
        ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

int SendRawPost(const RawPost& post) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  timeval tv{post.timeout_s, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(post.port));
  if (::inet_pton(AF_INET, post.host.c_str(), &addr.sin_addr) != 1 ||
      ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) !=
          0) {
    ::close(fd);
    return 0;
  }
  std::string head =
      absl::StrCat("POST ", post.path, " HTTP/1.1\r\nHost: ", post.host,
                   "\r\nContent-Type: application/json\r\n");
  absl::StrAppend(
      &head,
      post.chunked ? std::string("Transfer-Encoding: chunked\r\n")
                   : absl::StrCat("Content-Length: ", post.body_bytes, "\r\n"),
      "\r\n");
  bool open = SendAll(fd, head);
  constexpr int64_t kPiece = int64_t{1} << 20;
  const std::string piece(kPiece, 'x');
  for (int64_t left = post.body_bytes; open && left > 0; left -= kPiece) {
    const int64_t n = std::min(left, kPiece);
    if (post.chunked) {
      char size[32];
      std::snprintf(size, sizeof(size), "%llx\r\n",
                    static_cast<unsigned long long>(n));
      open = SendAll(fd, size);
    }
    open = open && SendAll(fd, piece.substr(0, static_cast<size_t>(n)));
    if (post.chunked) open = open && SendAll(fd, "\r\n");
  }
  if (open && post.chunked) SendAll(fd, "0\r\n\r\n");
  // The answer's first line: "HTTP/1.1 <code> ...".
  std::string answer;
  char buf[512];
  while (answer.find("\r\n") == std::string::npos && answer.size() < 4096) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    answer.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  const size_t space = answer.find(' ');
  if (!absl::StartsWith(answer, "HTTP/") || space == std::string::npos) {
    return 0;
  }
  return std::atoi(answer.c_str() + space + 1);
}

}  // namespace testing
}  // namespace asyncps
