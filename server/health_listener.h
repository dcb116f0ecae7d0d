#ifndef ASYNCPS_SERVER_HEALTH_LISTENER_H_
#define ASYNCPS_SERVER_HEALTH_LISTENER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/reflection.h"

namespace asyncps {

// A second gRPC listener, plain TCP without a token, that serves only the
// standard grpc.health.v1.Health service (and server reflection, which
// lists nothing else: server/reflection.h). For probes that cannot speak TLS or
// present a client certificate, such as Kubernetes' gRPC probes, when the
// shard's own port uses TLS or mutual TLS or a cluster token (which health
// checks on the shard's own port need too). It exposes nothing but SERVING /
// NOT_SERVING, and takes small requests only: an open port must not let callers
// make the shard hold large messages.
//
// Thread-compatible: SetServing and Stop from one thread (main's); health
// calls are answered on gRPC's threads.
class HealthListener {
 public:
  // A health check names a service (a few dozen bytes): larger requests are
  // refused RESOURCE_EXHAUSTED. gRPC reads a whole request before it checks
  // its size, so what unfinished ones hold together is bounded apart
  // (common/request_guard.h): 256 checks in flight.
  static constexpr int kMaxHealthRequestBytes = 4096;
  // SERVING from Start until Stop, whatever SetServing says: the process
  // runs (restoring, standing by as a spare replica, or serving). For
  // liveness and startup probes, which must not restart a process that is
  // alive but does not serve (yet); readiness asks the shard's service.
  static constexpr char kProcessService[] = "asyncps.Process";
  static constexpr int64_t kMaxUnfinishedBytes = 1 << 20;

  // Binds host:port (0 = a free port) and answers `serving` (SERVING or
  // NOT_SERVING) for "" and every name in `services` until SetServing, and
  // SERVING for kProcessService.
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
  ReflectionAnswers reflection_{{"grpc.health.v1.Health",
                                 "grpc.reflection.v1.ServerReflection",
                                 "grpc.reflection.v1alpha.ServerReflection"}};
  ReflectionV1Service reflection_v1_{&reflection_};
  ReflectionV1AlphaService reflection_v1alpha_{&reflection_};
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_HEALTH_LISTENER_H_
