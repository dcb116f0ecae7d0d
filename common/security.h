#ifndef ASYNCPS_COMMON_SECURITY_H_
#define ASYNCPS_COMMON_SECURITY_H_

// Transport security (TLS / mutual TLS) and the shared cluster token, for
// both sides of every asyncps connection.
//
// What is checked, with everything on:
//   - the server presents tls_cert/tls_key; clients verify it against tls_ca
//     (and its name against the address dialled);
//   - with require_client_cert, the server requests and verifies a client
//     certificate against its own tls_ca; a client without one (or with one
//     the CA did not sign) fails the handshake;
//   - with cluster_token set, every call must carry the metadata
//     `authorization: Bearer <token>`; the server answers UNAUTHENTICATED,
//     before any handler runs, to a call without it or with another token.
//     Health checks too (a method open to all would let any caller make the
//     process hold whole max-sized requests); a shard's --health_port
//     serves probes without the token.
// The token works over plain TCP as well, but there it is sent in clear text.

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace asyncps {

// Security settings of one process. Paths name PEM files; empty = not used.
// Default-constructed = plain TCP, no token (the behaviour without flags).
struct SecurityOptions {
  std::string tls_cert;  // this side's certificate chain (server: required
                         // for TLS; client: only for mutual TLS)
  std::string tls_key;   // private key of tls_cert
  std::string tls_ca;    // CA bundle the peer's certificate is checked with
  // Server only: require and verify a client certificate signed by tls_ca.
  bool require_client_cert = false;
  // The shared token itself (not a path); empty = no token.
  std::string cluster_token;
  // Server only: called for every call refused for its cluster token
  // (`missing`: it carried none; else a wrong one), on gRPC's threads before
  // the call is answered UNAUTHENTICATED. Must be thread-safe and quick.
  // Empty = not called.
  std::function<void(bool missing)> on_token_refused;
};

// The command-line values of the security flags, as every binary takes them
// (--tls_cert --tls_key --tls_ca --tls_require_client_cert
// --cluster_token_file).
struct SecurityFlagValues {
  std::string tls_cert;
  std::string tls_key;
  std::string tls_ca;
  bool tls_require_client_cert = false;
  std::string cluster_token_file;
  // How errors name the three files' flags: "<prefix>cert", "<prefix>key",
  // "<prefix>ca" ("--etcd_" for the connection to etcd).
  std::string flag_prefix = "--tls_";
};

// Validates flag values and reads the token file (surrounding whitespace is
// stripped). `server` selects the server's rules (a certificate needs a key
// and vice versa; --tls_require_client_cert needs --tls_cert and --tls_ca).
// Errors are INVALID_ARGUMENT and name the flag and the file.
absl::StatusOr<SecurityOptions> SecurityOptionsFromFlagValues(
    const SecurityFlagValues& flags, bool server);

// A warning when other users may read or write the secret file at `path`
// (its mode has any of the bits 0007), naming the file, its mode and the
// fix; "" otherwise, or when the file cannot be examined. `flag` names the
// file's flag in it.
std::string TokenFileWarning(const std::string& path,
                             const std::string& flag = "--cluster_token_file");

// The whole contents of `path`; NOT_FOUND / PERMISSION_DENIED / INTERNAL
// naming `what` and the path.
absl::StatusOr<std::string> ReadPemFile(const std::string& path,
                                        const std::string& what);

// Insecure when no TLS file is given, else SslServerCredentials with
// tls_cert/tls_key (and the client certificate check with
// require_client_cert). With a cluster token the credentials also check it
// on every call (see above). Fails on unreadable files or inconsistent
// options.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const SecurityOptions& options);

// What a server presents when it calls another server of its run (a backup
// its primary, a shard a move's source): its tls_ca to verify the peer and
// its token; its own certificate under mutual TLS (require_client_cert),
// where the peer requires one, and without tls_ca, where the peer asks for
// none; not with tls_ca alone. There a server asks for client certificates
// and verifies those it gets, and server certificates are usually issued
// for serverAuth only: a backup presenting one was refused by its primary
// ("cannot reach the primary").
SecurityOptions PeerSecurity(const SecurityOptions& server);

// Insecure when neither tls_ca nor tls_cert is given, else SslCredentials
// with tls_ca as roots (system roots when empty) and tls_cert/tls_key as the
// client certificate when given. The token is not part of these credentials
// (gRPC sends call credentials only over secure channels); MakeChannel adds
// it with a client interceptor instead (TokenInterceptorFactory).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const SecurityOptions& options);

// A client interceptor factory that adds `authorization: Bearer <token>` to
// the initial metadata of every call on a channel. Works on insecure and
// secure channels alike.
std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>
TokenInterceptorFactory(const std::string& token);

// Constant-time (in the contents; not the lengths) string equality.
bool ConstantTimeEquals(const std::string& a, const std::string& b);

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_SECURITY_H_
