#ifndef ASYNCPS_COMMON_SECURITY_FLAGS_H_
#define ASYNCPS_COMMON_SECURITY_FLAGS_H_

// The security flags, defined once for every asyncps binary:
//   --tls_cert --tls_key --tls_ca --tls_require_client_cert
//   --cluster_token_file
// (and, like every flag, their ASYNCPS_* environment variables; see
// common/cli.h). A binary that links this library has them; only main()
// reads them, through SecurityOptionsFromFlags.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/security.h"

namespace asyncps {

// The flags' values as SecurityOptions, validated for a server (`server`)
// or a client, with the token read from its file. Errors name the flag
// (INVALID_ARGUMENT). Problems that do not stop the program (a token file
// that other users can read) are appended to *warnings.
absl::StatusOr<SecurityOptions> SecurityOptionsFromFlags(
    bool server, std::vector<std::string>* warnings);

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_SECURITY_FLAGS_H_
