#ifndef ASYNCPS_COMMON_HTTP_CONNECTIONS_H_
#define ASYNCPS_COMMON_HTTP_CONNECTIONS_H_

// Bounds what HTTP connections can hold. cpp-httplib serves a connection
// on one task-queue thread from accept to close, so with a fixed pool a few
// idle or slow connections starve every other caller (a shard's /metrics
// with 2 threads answered nothing within 3 s while 300 idle connections
// were open). Here each connection gets a thread of its own, up to a cap;
// one past the cap is answered 503 at once on the accepting thread; and a
// connection open longer than its lifetime is shut down, so one that
// trickles its request a byte at a time cannot keep its thread.

#include <httplib.h>

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/task_threads.h"

namespace asyncps {

struct HttpConnectionLimits {
  // Connections served at once; one more is answered 503 and closed.
  int max_connections = 512;
  // A connection is shut down this long after it was accepted, whatever
  // it is doing (httplib's own timeouts are per read and per idle wait).
  absl::Duration max_lifetime = absl::Seconds(60);
};

// The connections of one listening server: admission, lifetimes, threads.
class HttpConnectionGate {
 public:
  explicit HttpConnectionGate(HttpConnectionLimits limits);
  ~HttpConnectionGate();  // Shutdown()
  HttpConnectionGate(const HttpConnectionGate&) = delete;
  HttpConnectionGate& operator=(const HttpConnectionGate&) = delete;

  // Runs `serve` (which serves and closes one accepted socket) on a thread
  // of its own, or, at the cap, on the caller's thread marked as refused.
  void Run(std::function<void()> serve);

  // On a connection's thread, before serving `sock`: false if it must be
  // refused (at the cap, or shut down). An admitted socket may be shut
  // down (shutdown(2)) by its lifetime or Shutdown() while it is served;
  // Close ends it either way and closes it.
  bool Admit(int sock);
  void Close(int sock);

  // Ends every connection (shutdown(2) on its socket), waits for their
  // threads; later connections are refused. Idempotent.
  void Shutdown();

  // Connections being served now.
  int active() const;

 private:
  void ReapLoop();

  const HttpConnectionLimits limits_;
  TaskThreads threads_;
  mutable absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  // Admitted sockets and when they must end.
  std::map<int, absl::Time> deadlines_ ABSL_GUARDED_BY(mu_);
  std::thread reaper_;
};

// An httplib server whose connections pass through a gate. It serves a
// connection itself (httplib's loop is private): requests one after another
// on the connection's thread, up to the keep-alive count, closing it when
// it stays idle past the keep-alive timeout. It listens once: a second
// listen refuses every connection.
class GatedHttpServer : public httplib::Server {
 public:
  explicit GatedHttpServer(HttpConnectionLimits limits);
  ~GatedHttpServer() override;

  const HttpConnectionGate& gate() const { return *gate_; }

  // After binding: lets `backlog` connections wait to be accepted (httplib
  // listens with a backlog of 5, so a burst of connections beyond it waits
  // for SYN retransmits, a second and more each). False if not bound.
  bool SetBacklog(int backlog);

 private:
  bool process_and_close_socket(socket_t sock) override;

 private:
  std::shared_ptr<HttpConnectionGate> gate_;
};

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_HTTP_CONNECTIONS_H_
