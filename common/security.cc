#include "common/security.h"

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpcpp/support/client_interceptor.h>
#include <grpcpp/support/interceptor.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace asyncps {
namespace {

constexpr char kAuthorizationKey[] = "authorization";
constexpr char kBearerPrefix[] = "Bearer ";
// Health checks need the token too: gRPC reads a whole request before any
// handler, so a method open to every caller lets anyone make the process
// hold max-message-sized requests (four unauthenticated 250 MB health
// checks at once took a shard to 2.2 GB). Probes without the token go to a
// shard's --health_port (server/health_listener.h), whose requests are tiny.
constexpr absl::string_view kHealthPathPrefix = "/grpc.health.v1.Health/";

absl::string_view SliceView(const grpc_slice& s) {
  return absl::string_view(
      reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(s)),
      GRPC_SLICE_LENGTH(s));
}

// Checks the cluster token of every call in gRPC's server auth filter, i.e.
// after the headers arrive and before the call is matched to a handler. Runs
// for plain TCP and TLS ports alike. The token itself is consumed, so
// handlers never see it.
struct TokenProcessorState {
  std::string expected;                          // "Bearer <token>"
  std::function<void(bool missing)> on_refused;  // may be empty
};

void ProcessTokenMetadata(void* state, grpc_auth_context* /*context*/,
                          const grpc_metadata* md, size_t num_md,
                          grpc_process_auth_metadata_done_cb cb,
                          void* user_data) {
  const auto* s = static_cast<const TokenProcessorState*>(state);
  const grpc_metadata* token = nullptr;
  bool health = false;
  for (size_t i = 0; i < num_md; ++i) {
    const absl::string_view key = SliceView(md[i].key);
    if (key == ":path") {
      health = absl::StartsWith(SliceView(md[i].value), kHealthPathPrefix);
    } else if (key == kAuthorizationKey && token == nullptr) {
      token = &md[i];
    }
  }
  if (token != nullptr &&
      ConstantTimeEquals(std::string(SliceView(token->value)), s->expected)) {
    cb(user_data, token, 1, nullptr, 0, GRPC_STATUS_OK, nullptr);
    return;
  }
  if (s->on_refused) s->on_refused(token == nullptr);
  const char* why =
      token != nullptr ? "wrong cluster token"
      : health ? "missing cluster token (authorization metadata); health "
                 "checks without it go to the shard's --health_port"
               : "missing cluster token (authorization metadata)";
  cb(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_UNAUTHENTICATED, why);
}

void DestroyTokenProcessor(void* state) {
  delete static_cast<TokenProcessorState*>(state);
}

// Server credentials built on gRPC core's: plain TCP or SSL, optionally with
// the token check installed as the core auth metadata processor. (grpc++'s
// InsecureServerCredentials() refuses an AuthMetadataProcessor, and a server
// interceptor cannot answer UNAUTHENTICATED before the handler runs.)
class CoreServerCredentials final : public grpc::ServerCredentials {
 public:
  // Takes ownership of `creds`.
  explicit CoreServerCredentials(grpc_server_credentials* creds)
      : creds_(creds) {}
  ~CoreServerCredentials() override { grpc_server_credentials_release(creds_); }

  void SetAuthMetadataProcessor(
      const std::shared_ptr<grpc::AuthMetadataProcessor>& /*processor*/)
      override {
    // Only the cluster token processor (SetToken) is supported.
    std::abort();
  }

  void SetToken(const std::string& token,
                std::function<void(bool missing)> on_refused) {
    grpc_auth_metadata_processor p;
    p.process = &ProcessTokenMetadata;
    p.destroy = &DestroyTokenProcessor;
    p.state = new TokenProcessorState{absl::StrCat(kBearerPrefix, token),
                                      std::move(on_refused)};
    grpc_server_credentials_set_auth_metadata_processor(creds_, p);
  }

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    return grpc_server_add_http2_port(server, addr.c_str(), creds_);
  }

  grpc_server_credentials* const creds_;
};

class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  TokenInterceptor(const std::string* header) : header_(header) {}

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::
                PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace(kAuthorizationKey, *header_);
    }
    methods->Proceed();
  }

 private:
  const std::string* header_;  // owned by the factory, which outlives calls
};

class TokenInterceptorFactoryImpl final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactoryImpl(const std::string& token)
      : header_(absl::StrCat(kBearerPrefix, token)) {}

  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new TokenInterceptor(&header_);
  }

 private:
  const std::string header_;
};

bool HasTls(const SecurityOptions& o) {
  return !o.tls_cert.empty() || !o.tls_key.empty() || !o.tls_ca.empty();
}

}  // namespace

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  // Every byte of the longer string is looked at whatever the contents.
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? a[i] : 0;
    const unsigned char y = i < b.size() ? b[i] : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

std::string TokenFileWarning(const std::string& path, const std::string& flag) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || (st.st_mode & 0007) == 0) return "";
  return absl::StrCat(flag, " ", path, " is accessible to other users (mode ",
                      absl::StrFormat("%04o", st.st_mode & 07777),
                      "); make it private: chmod 600 ", path);
}

absl::StatusOr<std::string> ReadPemFile(const std::string& path,
                                        const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string msg =
        absl::StrCat(what, ": cannot read ", path, ": ", std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(msg);
    if (err == EACCES) return absl::PermissionDeniedError(msg);
    return absl::InternalError(msg);
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) {
    return absl::InternalError(absl::StrCat(what, ": error reading ", path));
  }
  return contents.str();
}

absl::StatusOr<SecurityOptions> SecurityOptionsFromFlagValues(
    const SecurityFlagValues& flags, bool server) {
  SecurityOptions o;
  o.tls_cert = flags.tls_cert;
  o.tls_key = flags.tls_key;
  o.tls_ca = flags.tls_ca;
  o.require_client_cert = flags.tls_require_client_cert;
  const std::string cert_flag = flags.flag_prefix + "cert";
  const std::string key_flag = flags.flag_prefix + "key";
  const std::string ca_flag = flags.flag_prefix + "ca";
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return absl::InvalidArgumentError(
        o.tls_cert.empty() ? absl::StrCat(key_flag, " needs ", cert_flag)
                           : absl::StrCat(cert_flag, " needs ", key_flag));
  }
  if (server && !o.tls_ca.empty() && o.tls_cert.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        ca_flag, " on a server needs ", cert_flag, " and ", key_flag));
  }
  if (o.require_client_cert) {
    if (!server) {
      return absl::InvalidArgumentError(
          "--tls_require_client_cert applies only to ps_server");
    }
    if (o.tls_cert.empty() || o.tls_ca.empty()) {
      return absl::InvalidArgumentError(
          "--tls_require_client_cert needs --tls_cert, --tls_key and "
          "--tls_ca");
    }
  }
  for (const auto& [flag, path] :
       {std::pair<const std::string*, const std::string*>{&cert_flag,
                                                          &o.tls_cert},
        {&key_flag, &o.tls_key},
        {&ca_flag, &o.tls_ca}}) {
    if (path->empty()) continue;
    absl::StatusOr<std::string> pem = ReadPemFile(*path, *flag);
    if (!pem.ok()) return absl::InvalidArgumentError(pem.status().message());
    if (pem->find("-----BEGIN") == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(*flag, ": ", *path, " holds no PEM block"));
    }
  }
  if (!flags.cluster_token_file.empty()) {
    absl::StatusOr<std::string> token =
        ReadPemFile(flags.cluster_token_file, "--cluster_token_file");
    if (!token.ok()) {
      return absl::InvalidArgumentError(token.status().message());
    }
    o.cluster_token = std::string(absl::StripAsciiWhitespace(*token));
    if (o.cluster_token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--cluster_token_file: ", flags.cluster_token_file,
                       " is empty (or only whitespace)"));
    }
    for (const char c : o.cluster_token) {
      // gRPC metadata values must be printable ASCII.
      if (c < 0x20 || c > 0x7e) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--cluster_token_file: ", flags.cluster_token_file,
            " holds a non-printable character; use a printable ASCII token "
            "(e.g. from `openssl rand -hex 32`)"));
      }
    }
  }
  return o;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const SecurityOptions& options) {
  grpc_server_credentials* core = nullptr;
  if (!HasTls(options)) {
    if (options.require_client_cert) {
      return absl::InvalidArgumentError(
          "require_client_cert needs tls_cert, tls_key and tls_ca");
    }
    core = grpc_insecure_server_credentials_create();
  } else {
    if (options.tls_cert.empty() || options.tls_key.empty()) {
      return absl::InvalidArgumentError(
          "a TLS server needs both tls_cert and tls_key");
    }
    if (options.require_client_cert && options.tls_ca.empty()) {
      return absl::InvalidArgumentError("require_client_cert needs tls_ca");
    }
    absl::StatusOr<std::string> cert =
        ReadPemFile(options.tls_cert, "tls_cert");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPemFile(options.tls_key, "tls_key");
    if (!key.ok()) return key.status();
    std::string ca;
    if (!options.tls_ca.empty()) {
      absl::StatusOr<std::string> c = ReadPemFile(options.tls_ca, "tls_ca");
      if (!c.ok()) return c.status();
      ca = *std::move(c);
    }
    grpc_ssl_pem_key_cert_pair pair = {key->c_str(), cert->c_str()};
    const grpc_ssl_client_certificate_request_type request =
        options.require_client_cert
            ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
        : ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                     : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY;
    core = grpc_ssl_server_credentials_create_ex(
        ca.empty() ? nullptr : ca.c_str(), &pair, 1, request, nullptr);
    if (core == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot make TLS server credentials from ",
                       options.tls_cert, ", ", options.tls_key));
    }
  }
  auto creds = std::make_shared<CoreServerCredentials>(core);
  if (!options.cluster_token.empty()) {
    creds->SetToken(options.cluster_token, options.on_token_refused);
  }
  return creds;
}

SecurityOptions PeerSecurity(const SecurityOptions& server) {
  SecurityOptions peer;
  peer.tls_cert = server.tls_cert;
  peer.tls_key = server.tls_key;
  peer.tls_ca = server.tls_ca;
  peer.cluster_token = server.cluster_token;
  // Without tls_ca a peer asks for no certificate (and the certificate
  // keeps the channel in TLS, with the system's roots).
  if (!server.tls_ca.empty() && !server.require_client_cert) {
    peer.tls_cert.clear();
    peer.tls_key.clear();
  }
  return peer;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const SecurityOptions& options) {
  if (!HasTls(options)) return grpc::InsecureChannelCredentials();
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "a client certificate needs both tls_cert and tls_key");
  }
  grpc::SslCredentialsOptions ssl;
  if (!options.tls_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPemFile(options.tls_ca, "tls_ca");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *std::move(ca);
  }
  if (!options.tls_cert.empty()) {
    absl::StatusOr<std::string> cert =
        ReadPemFile(options.tls_cert, "tls_cert");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPemFile(options.tls_key, "tls_key");
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *std::move(cert);
    ssl.pem_private_key = *std::move(key);
  }
  return grpc::SslCredentials(ssl);
}

std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>
TokenInterceptorFactory(const std::string& token) {
  return std::make_unique<TokenInterceptorFactoryImpl>(token);
}

}  // namespace asyncps
