#ifndef ASYNCPS_TESTS_TESTING_RAW_HTTP_H_
#define ASYNCPS_TESTS_TESTING_RAW_HTTP_H_

// An HTTP/1.1 POST written byte by byte on a plain socket, as a black-box
// caller may send it: a body of any size, with Content-Length or chunked,
// so that tests see what a server does before and while it reads it.
//
// Example:
//
//   RawPost post{"127.0.0.1", port, "/metrics", 64 << 20, /*chunked=*/true};
//   CHECK(SendRawPost(post) == 411);

#include <cstdint>
#include <string>

namespace asyncps {
namespace testing {

struct RawPost {
  std::string host;  // IPv4 address
  int port = 0;
  std::string path;
  int64_t body_bytes = 0;  // of 'x'
  bool chunked = false;    // Transfer-Encoding: chunked, 1 MiB chunks
  int timeout_s = 30;      // for every send and for the answer
};

// Sends the request (stopping early, without error, if the server closes
// the connection) and returns the answer's status code, or 0 when none
// came within the timeout.
int SendRawPost(const RawPost& post);

}  // namespace testing
}  // namespace asyncps

#endif  // ASYNCPS_TESTS_TESTING_RAW_HTTP_H_
