#ifndef ASYNCPS_COMMON_CONNECTION_CHECK_H_
#define ASYNCPS_COMMON_CONNECTION_CHECK_H_

// Why a client cannot talk to a shard, in words an operator can act on.
//
// gRPC reports every failed TLS setup as UNAVAILABLE "Socket closed" (or a
// bare handshake error), whichever side was misconfigured. After such a
// failure a client calls DiagnoseConnection: it connects once more itself
// (TCP, then a TLS handshake with OpenSSL, then the HTTP/2 preface) and
// names the cause:
//   - nothing listens / the host does not resolve;
//   - the shard speaks TLS and this client plain TCP (or the reverse);
//   - the shard's certificate does not verify against --tls_ca, has
//     expired, or does not name the address dialled;
//   - the shard requires a client certificate (mutual TLS) and this client
//     sent none, or refused this client's certificate (another CA,
//     expired).

#include <string>

#include "absl/time/time.h"
#include "common/security.h"

namespace asyncps {

// The cause, as one sentence naming the side that wants what, or "" when
// the probe connection works (the failure lies elsewhere) or shows nothing
// specific. Blocks up to about 3 * `timeout`. `reached` (if not null) tells
// whether a TCP connection was made: false means the cause is that nothing
// listens there (yet), true that the two sides disagree. Thread-safe.
std::string DiagnoseConnection(const std::string& address,
                               const SecurityOptions& security,
                               absl::Duration timeout = absl::Seconds(2),
                               bool* reached = nullptr);

// Whether `address` ("host:port") refuses connections: its host answered
// (ECONNREFUSED) on every address it resolves to that nothing listens at
// that port. False when a connection is made, when the host does not
// answer within `timeout`, or when it does not resolve: only a refusal
// says that the process which served there is gone. Thread-safe.
bool NothingListens(const std::string& address, absl::Duration timeout);

// A problem with this side's own certificate files that needs no
// connection to see: a --tls_cert that has expired or is not yet valid.
// "" when there is none (or no certificate).
std::string CheckOwnCertificate(const SecurityOptions& security);

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_CONNECTION_CHECK_H_
