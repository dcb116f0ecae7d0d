#include "common/security_flags.h"

#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain. ps_server: serve TLS with it (needs "
          "--tls_key). ps_worker, psctl: the client certificate for mutual "
          "TLS (with --tls_key).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle. ps_server: verifies client certificates with it. "
          "ps_worker, psctl: verifies the shards' certificates with it (and "
          "turns TLS on).");
ABSL_FLAG(bool, tls_require_client_cert, false,
          "ps_server only (others exit 2): mutual TLS, refuse clients "
          "without a certificate signed by --tls_ca.");
ABSL_FLAG(std::string, cluster_token_file, "",
          "File holding the shared cluster token (e.g. from `openssl rand "
          "-hex 32`, chmod 600). ps_server: every call must carry it, health "
          "checks too (probes without it use --health_port), others get "
          "UNAUTHENTICATED. Clients send it with "
          "every call. Empty = no token.");

namespace asyncps {

absl::StatusOr<SecurityOptions> SecurityOptionsFromFlags(
    bool server, std::vector<std::string>* warnings) {
  SecurityFlagValues v;
  v.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  v.tls_key = absl::GetFlag(FLAGS_tls_key);
  v.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  v.tls_require_client_cert = absl::GetFlag(FLAGS_tls_require_client_cert);
  v.cluster_token_file = absl::GetFlag(FLAGS_cluster_token_file);
  absl::StatusOr<SecurityOptions> options =
      SecurityOptionsFromFlagValues(v, server);
  if (options.ok() && !v.cluster_token_file.empty()) {
    std::string warning = TokenFileWarning(v.cluster_token_file);
    if (!warning.empty()) warnings->push_back(std::move(warning));
  }
  return options;
}

}  // namespace asyncps
