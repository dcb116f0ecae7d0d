#ifndef ASYNCPS_TESTS_TESTING_TEST_PKI_H_
#define ASYNCPS_TESTS_TESTING_TEST_PKI_H_

// A throwaway CA, a server certificate (subjectAltName IP:127.0.0.1 and
// DNS:localhost), client certificates and token files, made once per test
// process with the openssl command line under the test's temporary folder;
// no key is part of the source tree.

#include <string>

namespace asyncps {
namespace testing {

// The token in Pki::token_file.
inline constexpr char kClusterToken[] = "s3cret-cluster-token-0123456789abcdef";

// Paths of the generated PEM files and token files.
struct Pki {
  std::string dir;
  std::string ca, server_cert, server_key, client_cert, client_key;
  std::string rogue_cert, rogue_key;      // client cert signed by another CA
  std::string expired_cert, expired_key;  // signed by the CA, expired
  std::string token_file;                 // kClusterToken, mode 0600
  std::string wrong_token_file, empty_token_file;
};

// Made at the first call (the test fails when openssl does).
const Pki& TestPki();

// Writes `contents` to `path` (the test fails when it cannot).
void WriteFile(const std::string& path, const std::string& contents);

// Runs a shell command; the test fails unless it exits 0.
void Shell(const std::string& command);

}  // namespace testing
}  // namespace asyncps

#endif  // ASYNCPS_TESTS_TESTING_TEST_PKI_H_
