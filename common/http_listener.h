#ifndef ASYNCPS_COMMON_HTTP_LISTENER_H_
#define ASYNCPS_COMMON_HTTP_LISTENER_H_

// A plain-HTTP endpoint on a thread of its own (cpp-httplib), for the
// metrics of ps_server and the REST form of ps_serve: binds, serves the
// routes its owner installs (each connection on a thread of its own, up to
// a cap: http_connections.h), and stops promptly.

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/http_connections.h"

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

  // `what` names the endpoint in errors ("metrics"); `limits` bound the
  // connections served at once and how long each may stay open.
  HttpListener(std::string what, HttpConnectionLimits limits, Routes routes);
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

  // Stops accepting, ends every open connection, finishes the serving
  // threads. Idempotent.
  void Stop();

  // Connections being served now (0 when stopped).
  int active_connections();

 private:
  const std::string what_;
  const HttpConnectionLimits limits_;
  const Routes routes_;
  absl::Mutex mu_;
  std::unique_ptr<GatedHttpServer> server_ ABSL_GUARDED_BY(mu_);
  std::thread thread_ ABSL_GUARDED_BY(mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_HTTP_LISTENER_H_
