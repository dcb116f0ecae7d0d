#include "common/connection_check.h"

#include <fcntl.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/no_sigpipe.h"

namespace asyncps {
namespace {

// The connection preface every HTTP/2 client sends, then an empty SETTINGS
// frame (length 0, type 4, flags 0, stream 0). A gRPC server answers with
// a SETTINGS frame of its own.
constexpr char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
constexpr unsigned char kEmptySettings[] = {0, 0, 0, 4, 0, 0, 0, 0, 0};
constexpr unsigned char kSettingsType = 4;

struct HostPort {
  std::string host;
  std::string port;
};

std::optional<HostPort> SplitAddress(absl::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return std::nullopt;
  absl::string_view host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return HostPort{std::string(host), std::string(address.substr(colon + 1))};
}

// A connected socket, closed on destruction.
class Socket {
 public:
  Socket() = default;
  ~Socket() {
    if (fd_ >= 0) close(fd_);
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  // Connects with a deadline; later reads and writes block at most
  // `timeout` each. On failure says why in *error, and *refused tells
  // whether every address tried refused (null: not asked).
  bool Connect(const HostPort& hp, absl::Duration timeout, std::string* error,
               bool* refused = nullptr) {
    if (refused != nullptr) *refused = false;
    addrinfo hints = {};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int gai =
        getaddrinfo(hp.host.c_str(), hp.port.c_str(), &hints, &found);
    if (gai != 0) {
      *error = absl::StrCat("cannot resolve host '", hp.host,
                            "': ", gai_strerror(gai));
      return false;
    }
    std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> list(found,
                                                            &freeaddrinfo);
    const int timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(timeout));
    bool every_refused = true, tried = false;
    for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
      const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
      if (fd < 0) continue;
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
      int rc = connect(fd, a->ai_addr, a->ai_addrlen);
      if (rc != 0 && errno == EINPROGRESS) {
        pollfd p = {fd, POLLOUT, 0};
        if (poll(&p, 1, timeout_ms) != 1) {
          errno = ETIMEDOUT;
        } else {
          int so_error = 0;
          socklen_t len = sizeof(so_error);
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len);
          errno = so_error;
          rc = so_error == 0 ? 0 : -1;
        }
      }
      if (rc == 0) {
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
        timeval tv = absl::ToTimeval(timeout);
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        fd_ = fd;
        return true;
      }
      tried = true;
      every_refused = every_refused && errno == ECONNREFUSED;
      *error = absl::StrCat("nothing accepts connections at ", hp.host, ":",
                            hp.port, " (", std::strerror(errno), ")");
      close(fd);
    }
    if (refused != nullptr) *refused = tried && every_refused;
    return false;
  }

  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

// Whether the peer answers the HTTP/2 preface in plain text with SETTINGS.
bool SpeaksPlainHttp2(const HostPort& hp, absl::Duration timeout) {
  Socket s;
  std::string error;
  if (!s.Connect(hp, timeout, &error)) return false;
  std::string hello = kPreface;
  hello.append(reinterpret_cast<const char*>(kEmptySettings),
               sizeof(kEmptySettings));
  if (send(s.fd(), hello.data(), hello.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(hello.size())) {
    return false;
  }
  unsigned char frame[9];
  size_t got = 0;
  while (got < sizeof(frame)) {
    const ssize_t n = recv(s.fd(), frame + got, sizeof(frame) - got, 0);
    if (n <= 0) return false;
    got += static_cast<size_t>(n);
  }
  return frame[3] == kSettingsType;
}

// What the TLS probe saw.
struct TlsProbe {
  bool handshake_ok = false;
  std::string alert;  // the last alert the peer sent, e.g. "unknown CA"
  long verify_result = X509_V_OK;
  bool name_matches = true;
  bool http2_ok = false;    // the peer answered the preface over TLS
  std::string setup_error;  // our own files could not be loaded
};

void RecordAlert(const SSL* ssl, int where, int ret) {
  if ((where & SSL_CB_ALERT) == 0 || (where & SSL_CB_READ) == 0) return;
  auto* probe = static_cast<TlsProbe*>(SSL_get_app_data(ssl));
  if (probe != nullptr) probe->alert = SSL_alert_desc_string_long(ret);
}

bool IsIpAddress(const std::string& host) {
  addrinfo hints = {};
  hints.ai_flags = AI_NUMERICHOST;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  freeaddrinfo(found);
  return true;
}

TlsProbe ProbeTls(const HostPort& hp, const SecurityOptions& security,
                  absl::Duration timeout) {
  TlsProbe probe;
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(
      SSL_CTX_new(TLS_client_method()), &SSL_CTX_free);
  if (ctx == nullptr) {
    probe.setup_error = "cannot create a TLS context";
    return probe;
  }
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_NONE, nullptr);
  if (!security.tls_ca.empty()) {
    SSL_CTX_load_verify_locations(ctx.get(), security.tls_ca.c_str(), nullptr);
  } else {
    SSL_CTX_set_default_verify_paths(ctx.get());
  }
  if (!security.tls_cert.empty() &&
      (SSL_CTX_use_certificate_chain_file(ctx.get(),
                                          security.tls_cert.c_str()) != 1 ||
       SSL_CTX_use_PrivateKey_file(ctx.get(), security.tls_key.c_str(),
                                   SSL_FILETYPE_PEM) != 1)) {
    probe.setup_error =
        absl::StrCat("cannot load --tls_cert ", security.tls_cert,
                     " with --tls_key ", security.tls_key);
    ERR_clear_error();
    return probe;
  }
  static const unsigned char kAlpn[] = {2, 'h', '2'};
  SSL_CTX_set_alpn_protos(ctx.get(), kAlpn, sizeof(kAlpn));
  SSL_CTX_set_info_callback(ctx.get(), &RecordAlert);

  Socket s;
  std::string error;
  if (!s.Connect(hp, timeout, &error)) return probe;
  std::unique_ptr<SSL, decltype(&SSL_free)> ssl(SSL_new(ctx.get()), &SSL_free);
  SSL_set_app_data(ssl.get(), &probe);
  SSL_set_fd(ssl.get(), s.fd());
  const bool ip = IsIpAddress(hp.host);
  if (!ip) SSL_set_tlsext_host_name(ssl.get(), hp.host.c_str());
  probe.handshake_ok = SSL_connect(ssl.get()) == 1;
  if (probe.handshake_ok) {
    probe.verify_result = SSL_get_verify_result(ssl.get());
    X509* peer = SSL_get1_peer_certificate(ssl.get());
    if (peer != nullptr) {
      probe.name_matches =
          ip ? X509_check_ip_asc(peer, hp.host.c_str(), 0) == 1
             : X509_check_host(peer, hp.host.c_str(), 0, 0, nullptr) == 1;
      X509_free(peer);
    }
    // Under TLS 1.3 a server refuses a client certificate only after the
    // client has finished: its alert arrives with the first read.
    std::string hello = kPreface;
    hello.append(reinterpret_cast<const char*>(kEmptySettings),
                 sizeof(kEmptySettings));
    unsigned char frame[9];
    if (SSL_write(ssl.get(), hello.data(), static_cast<int>(hello.size())) ==
        static_cast<int>(hello.size())) {
      int got = 0;
      while (got < static_cast<int>(sizeof(frame))) {
        const int n = SSL_read(ssl.get(), frame + got,
                               static_cast<int>(sizeof(frame)) - got);
        if (n <= 0) break;
        got += n;
      }
      probe.http2_ok = got == sizeof(frame) && frame[3] == kSettingsType;
    }
  }
  SSL_set_app_data(ssl.get(), nullptr);
  ERR_clear_error();
  return probe;
}

bool HasTlsSettings(const SecurityOptions& s) {
  return !s.tls_ca.empty() || !s.tls_cert.empty();
}

std::string AlertNote(const std::string& alert) {
  return alert.empty() ? "" : absl::StrCat(" (TLS alert: ", alert, ")");
}

// The peer refused our certificate, or its absence, after the handshake
// (an alert, or gRPC closing the connection).
std::string ClientCertificateRefused(const std::string& alert,
                                     const SecurityOptions& security) {
  if (security.tls_cert.empty()) {
    return absl::StrCat(
        "the shard requires a client certificate (mutual TLS, "
        "--tls_require_client_cert) and this client sent none: give "
        "--tls_cert and --tls_key signed by the shard's --tls_ca",
        AlertNote(alert));
  }
  if (absl::StrContains(alert, "expired") ||
      absl::StrContains(CheckOwnCertificate(security), "expired")) {
    return absl::StrCat("the shard refused this client's certificate ",
                        security.tls_cert, ": it has expired",
                        AlertNote(alert));
  }
  return absl::StrCat("the shard refused this client's certificate ",
                      security.tls_cert,
                      ": it is not signed by the CA the shard trusts (its "
                      "--tls_ca)",
                      AlertNote(alert));
}

}  // namespace

std::string CheckOwnCertificate(const SecurityOptions& security) {
  if (security.tls_cert.empty()) return "";
  FILE* f = std::fopen(security.tls_cert.c_str(), "r");
  if (f == nullptr) return "";
  X509* cert = PEM_read_X509(f, nullptr, nullptr, nullptr);
  std::fclose(f);
  if (cert == nullptr) {
    ERR_clear_error();
    return "";
  }
  std::string problem;
  if (X509_cmp_current_time(X509_get0_notAfter(cert)) < 0) {
    problem = absl::StrCat("this client's certificate ", security.tls_cert,
                           " has expired");
  } else if (X509_cmp_current_time(X509_get0_notBefore(cert)) > 0) {
    problem = absl::StrCat("this client's certificate ", security.tls_cert,
                           " is not valid yet");
  }
  X509_free(cert);
  return problem;
}

std::string DiagnoseConnection(const std::string& address,
                               const SecurityOptions& security,
                               absl::Duration timeout, bool* reached) {
  NoSigpipe no_sigpipe;
  if (reached != nullptr) *reached = false;
  const std::optional<HostPort> hp = SplitAddress(address);
  if (!hp.has_value()) return "";
  {
    Socket s;
    std::string error;
    if (!s.Connect(*hp, timeout, &error)) return error;
  }
  if (reached != nullptr) *reached = true;
  const bool client_tls = HasTlsSettings(security);
  const TlsProbe tls = ProbeTls(*hp, security, timeout);
  if (!tls.setup_error.empty()) return tls.setup_error;
  if (!tls.handshake_ok) {
    if (!tls.alert.empty() && client_tls) {
      return ClientCertificateRefused(tls.alert, security);
    }
    if (SpeaksPlainHttp2(*hp, timeout)) {
      return client_tls
                 ? "the shard speaks plain TCP but this client uses TLS "
                   "(--tls_ca/--tls_cert): drop those flags, or start the "
                   "shard with --tls_cert and --tls_key"
                 : "";
    }
    return client_tls ? "the TLS handshake with the shard failed and it does "
                        "not answer as a gRPC server (is this a shard's "
                        "port?)"
                      : "";
  }
  if (!client_tls) {
    return "the shard speaks TLS but this client connects in plain TCP: give "
           "--tls_ca (the CA that signed the shard's certificate)";
  }
  if (tls.verify_result != X509_V_OK) {
    const std::string reason = X509_verify_cert_error_string(tls.verify_result);
    if (tls.verify_result == X509_V_ERR_CERT_HAS_EXPIRED) {
      return "the shard's certificate has expired";
    }
    return absl::StrCat(
        "the shard's certificate is not accepted with --tls_ca ",
        security.tls_ca.empty() ? "(system CAs)" : security.tls_ca, ": ",
        reason);
  }
  if (!tls.name_matches) {
    return absl::StrCat("the shard's certificate does not name '", hp->host,
                        "' (the address dialled); add it to the certificate's "
                        "subjectAltName (",
                        IsIpAddress(hp->host) ? "IP:" : "DNS:", hp->host,
                        ") or dial a name it has");
  }
  // A TLS server that completes the handshake and then hangs up on the
  // HTTP/2 preface refused the client's certificate (gRPC checks it then,
  // under TLS 1.3).
  if (!tls.http2_ok) return ClientCertificateRefused(tls.alert, security);
  return "";
}

bool NothingListens(const std::string& address, absl::Duration timeout) {
  const std::optional<HostPort> hp = SplitAddress(address);
  if (!hp.has_value()) return false;
  Socket s;
  std::string error;
  bool refused = false;
  return !s.Connect(*hp, timeout, &error, &refused) && refused;
}

}  // namespace asyncps
