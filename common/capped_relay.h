#ifndef ASYNCPS_COMMON_CAPPED_RELAY_H_
#define ASYNCPS_COMMON_CAPPED_RELAY_H_

// A TCP relay that puts a byte budget on every connection, in front of a
// gRPC server that must stay open to callers who are not trusted (the
// shard's plain health port for Kubernetes' probes).
//
// gRPC (1.51) opens a stream's flow-control window to the size a request's
// length prefix announces, whatever the server's maximum message size, and
// keeps what arrives until all of it has, before any handler or size check
// runs. Streams that announce large requests and never finish them took a
// shard's health port (4 KiB requests at most, a 16 MiB gRPC memory quota)
// to 2.8 GB in 8 s. Through the relay a connection ends once its client has
// sent `max_client_bytes`, so what gRPC can hold is bounded by
// max_connections x max_client_bytes; a health check takes a few hundred
// bytes.
//
// One thread relays every connection (poll). Connections beyond
// max_connections are closed as they are accepted; one idle in both
// directions for `idle`, or open for `lifetime`, is ended.
//
// Thread-safe: Stop from any thread.

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace asyncps {

struct CappedRelayOptions {
  int max_connections = 128;
  int64_t max_client_bytes = 64 << 10;
  absl::Duration idle = absl::Seconds(10);
  absl::Duration lifetime = absl::Seconds(60);
};

class CappedRelay {
 public:
  // Listens on host:port (0 = a free port) and relays each connection to
  // 127.0.0.1:backend_port. UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<CappedRelay>> Start(
      const std::string& host, int port, int backend_port,
      const CappedRelayOptions& options);
  ~CappedRelay();  // Stop()

  CappedRelay(const CappedRelay&) = delete;
  CappedRelay& operator=(const CappedRelay&) = delete;

  int port() const { return port_; }

  // Closes the listener and every relayed connection. Idempotent.
  void Stop();

 private:
  CappedRelay(int listen_fd, int port, int backend_port, int wake_read,
              int wake_write, const CappedRelayOptions& options);
  void Loop();

  const int listen_fd_;
  const int port_;
  const int backend_port_;
  const int wake_read_, wake_write_;  // a pipe that ends Loop
  const CappedRelayOptions options_;
  std::thread thread_;
  std::once_flag stopped_;
};

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_CAPPED_RELAY_H_
