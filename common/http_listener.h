#ifndef ASYNCPS_COMMON_HTTP_LISTENER_H_
#define ASYNCPS_COMMON_HTTP_LISTENER_H_

// A plain-HTTP endpoint on a thread of its own (cpp-httplib), for the
// metrics of ps_server and the REST form of ps_serve: binds, serves the
// routes its owner installs, and stops promptly.

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace asyncps {

class HttpListener {
 public:
  // The largest request body taken unless the routes set another limit
  // (httplib::Server::set_payload_max_length).
  static constexpr size_t kDefaultMaxBodyBytes = 64 << 10;

  // Installs the handlers on a new server; called once per Start.
  using Routes = std::function<void(httplib::Server* server)>;

  // `what` names the endpoint in errors ("metrics"); `threads` handle
  // requests (a request holds its thread until answered).
  HttpListener(std::string what, int threads, Routes routes);
  ~HttpListener();  // Stop()
  HttpListener(const HttpListener&) = delete;
  HttpListener& operator=(const HttpListener&) = delete;

  // Binds host:port (port 0 = a free port; "::" takes IPv4 too) with
  // SO_REUSEADDR only (a leftover process cannot share the port) and starts
  // serving. Returns the bound port; INVALID_ARGUMENT for a port outside
  // [0, 65535], UNAVAILABLE if the address cannot be bound,
  // FAILED_PRECONDITION if already started. After an error, call Stop()
  // before starting again.
  absl::StatusOr<int> Start(const std::string& host, int port);

  // Stops accepting, finishes the serving thread. Idempotent.
  void Stop();

 private:
  const std::string what_;
  const int threads_;
  const Routes routes_;
  absl::Mutex mu_;
  std::unique_ptr<httplib::Server> server_ ABSL_GUARDED_BY(mu_);
  std::thread thread_ ABSL_GUARDED_BY(mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_HTTP_LISTENER_H_
