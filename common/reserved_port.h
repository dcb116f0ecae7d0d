#ifndef ASYNCPS_COMMON_RESERVED_PORT_H_
#define ASYNCPS_COMMON_RESERVED_PORT_H_

// A TCP port chosen by the OS and kept from other programs until the
// server that advertised it listens there.
//
// A replica (ps_server --replicas, --port=0) puts its address in etcd
// when it starts, but may stand by for hours before its gRPC server binds
// that port: a port merely found free then could be taken by any program
// meanwhile. A ReservedPort holds it bound (not listening: a connection
// there is refused, as to nothing) and without SO_REUSEADDR, so that no
// other bind of it succeeds; Release() closes the socket just before the
// server binds it.
//
// Example:
//
//   absl::StatusOr<ReservedPort> port = ReservedPort::Pick("0.0.0.0");
//   ... advertise port->port(), wait ...
//   port->Release();
//   ... start the server on port->port() ...

#include <string>

#include "absl/status/statusor.h"

namespace asyncps {

class ReservedPort {
 public:
  ReservedPort() = default;
  // A port of `host` (an IPv4 literal; anything else: every address) the
  // OS chose, held bound by this object.
  static absl::StatusOr<ReservedPort> Pick(const std::string& host);
  ReservedPort(ReservedPort&& other) noexcept;
  ReservedPort& operator=(ReservedPort&& other) noexcept;
  ReservedPort(const ReservedPort&) = delete;
  ReservedPort& operator=(const ReservedPort&) = delete;
  ~ReservedPort() { Release(); }

  int port() const { return port_; }
  bool held() const { return fd_ >= 0; }
  // Lets the port go (idempotent); port() stays.
  void Release();

 private:
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_RESERVED_PORT_H_
