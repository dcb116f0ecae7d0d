#ifndef ASYNCPS_SERVER_HEALTH_LISTENER_H_
#define ASYNCPS_SERVER_HEALTH_LISTENER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace asyncps {

// A second gRPC listener, plain TCP without a token, that serves only the
// standard grpc.health.v1.Health service (and gRPC's reflection, which then
// lists nothing else). For probes that cannot speak TLS or present a client
// certificate, such as Kubernetes' gRPC probes, when the shard's own port
// uses TLS or mutual TLS. It exposes nothing but SERVING / NOT_SERVING.
//
// Thread-compatible: SetServing and Stop from one thread (main's); health
// calls are answered on gRPC's threads.
class HealthListener {
 public:
  // Binds host:port (0 = a free port) and answers `serving` (SERVING or
  // NOT_SERVING) for "" and every name in `services` until SetServing.
  // UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<HealthListener>> Start(
      const std::string& host, int port, std::vector<std::string> services,
      bool serving = true);
  ~HealthListener();  // Stop()

  int port() const { return port_; }

  // The status of "" and every service given to Start.
  void SetServing(bool serving);

  // Stops listening (waits up to a second for calls in flight). Idempotent.
  void Stop();

 private:
  HealthListener() = default;

  std::vector<std::string> services_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_HEALTH_LISTENER_H_
