#ifndef ASYNCPS_TESTS_TESTING_TCP_PROXY_H_
#define ASYNCPS_TESTS_TESTING_TCP_PROXY_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace asyncps {
namespace testing {

// A TCP proxy on 127.0.0.1 for fault tests: it forwards connections to a
// backend and can, on request, drop them the moment the backend answers
// after a large request (a request that arrived, but whose answer is lost),
// hold all traffic (a network cut: connections stay open, nothing moves),
// or close everything. Byte-level, so it works for any protocol (HTTP/2,
// TLS). Thread-safe; a thread of its own does the forwarding.
class TcpProxy {
 public:
  // Listens on an ephemeral loopback port, forwarding to `backend`
  // ("127.0.0.1:port").
  static absl::StatusOr<std::unique_ptr<TcpProxy>> Start(
      const std::string& backend);
  ~TcpProxy();  // closes everything and joins the thread

  // "127.0.0.1:<port>", for clients.
  std::string address() const;

  // The next time the client side has sent at least `min_request_bytes`
  // since this call and the backend then sends anything back, every
  // connection is reset and that answer is lost. Repeats `times` times.
  void LoseNextAnswers(int times, int64_t min_request_bytes);
  // While held, nothing is forwarded in either direction and new
  // connections wait (a network cut); Release resumes.
  void Hold();
  void Release();
  // Resets every connection now.
  void ResetAll();

  int answers_lost() const { return lost_.load(); }
  int connections() const { return accepted_.load(); }
  // HTTP/2 frames the clients sent that do a call's work (HEADERS, DATA),
  // as CallLedger counts them, over every connection.
  uint64_t client_work_frames() const { return work_frames_.load(); }
  // Reads of the clients' bytes that held frames but none of those: a
  // WINDOW_UPDATE or PING the client wrote on its own, which woke the
  // server for nothing.
  uint64_t client_idle_only_reads() const { return idle_only_reads_.load(); }

 private:
  class Impl;
  explicit TcpProxy(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
  std::atomic<int> lost_{0};
  std::atomic<int> accepted_{0};
  std::atomic<uint64_t> work_frames_{0};
  std::atomic<uint64_t> idle_only_reads_{0};
};

}  // namespace testing
}  // namespace asyncps

#endif  // ASYNCPS_TESTS_TESTING_TCP_PROXY_H_
