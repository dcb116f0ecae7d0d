#include "tests/testing/held_requests.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/no_sigpipe.h"
#include "tests/testing/h2_frames.h"

namespace asyncps {
namespace testing {
namespace {

constexpr int64_t kDefaultWindow = 65535;
// Bytes queued per connection before the next write; bounds the overshoot
// of max_bytes.
constexpr size_t kQueueBytes = 256 << 10;

void AppendFrame(uint8_t type, uint8_t flags, uint32_t stream,
                 const std::string& payload, std::string* out) {
  out->append(H2Frame(type, flags, stream, payload));
}

uint32_t ReadU32(const std::string& s, size_t at) {
  return (uint32_t{static_cast<uint8_t>(s[at])} << 24) |
         (uint32_t{static_cast<uint8_t>(s[at + 1])} << 16) |
         (uint32_t{static_cast<uint8_t>(s[at + 2])} << 8) |
         uint32_t{static_cast<uint8_t>(s[at + 3])};
}

// An HPACK string: no Huffman coding, its length a 7-bit-prefix integer.
void AppendHpackString(const std::string& s, std::string* out) {
  size_t n = s.size();
  if (n < 127) {
    out->push_back(static_cast<char>(n));
  } else {
    out->push_back(static_cast<char>(127));
    for (n -= 127; n >= 128; n >>= 7) {
      out->push_back(static_cast<char>((n & 0x7f) | 0x80));
    }
    out->push_back(static_cast<char>(n));
  }
  out->append(s);
}

// A gRPC call's request headers, each a literal without indexing.
std::string RequestHeaders(const std::string& path) {
  const std::pair<std::string, std::string> fields[] = {
      {":method", "POST"},
      {":scheme", "http"},
      {":path", path},
      {":authority", "127.0.0.1"},
      {"content-type", "application/grpc"},
      {"te", "trailers"}};
  std::string block;
  for (const auto& [name, value] : fields) {
    block.push_back(0);
    AppendHpackString(name, &block);
    AppendHpackString(value, &block);
  }
  return block;
}

struct Stream {
  int64_t window = kDefaultWindow;
  int64_t remaining = 0;  // request bytes still to send
};

// A connected socket, its bytes in plain text or through TLS.
class Transport {
 public:
  // Takes `fd` (blocking); with `tls` non-null, makes the TLS handshake
  // first, within 10 s. The socket is non-blocking afterwards.
  static absl::StatusOr<std::unique_ptr<Transport>> Open(int fd, SSL_CTX* tls) {
    std::unique_ptr<Transport> t(new Transport(fd));
    if (tls != nullptr) {
      const timeval limit = {10, 0};  // each read and write of the handshake
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
      t->ssl_ = SSL_new(tls);
      SSL_set_fd(t->ssl_, fd);
      if (SSL_connect(t->ssl_) != 1) {
        ERR_clear_error();
        return absl::UnavailableError("TLS handshake failed");
      }
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return t;
  }
  ~Transport() {
    if (ssl_ != nullptr) SSL_free(ssl_);
    close(fd_);
  }

  int fd() const { return fd_; }

  // Bytes moved; 0 when the socket would block; -1 when the connection is
  // closed or failed.
  ssize_t Send(const char* data, size_t n) {
    if (ssl_ == nullptr) {
      const ssize_t r = send(fd_, data, n, MSG_NOSIGNAL);
      return r >= 0 ? r : (errno == EAGAIN || errno == EINTR ? 0 : -1);
    }
    return Tls(
        SSL_write(ssl_, data, static_cast<int>(std::min<size_t>(n, 1 << 20))));
  }
  ssize_t Receive(char* data, size_t n) {
    if (ssl_ == nullptr) {
      const ssize_t r = recv(fd_, data, n, 0);
      if (r == 0) return -1;
      return r > 0 ? r : (errno == EAGAIN || errno == EINTR ? 0 : -1);
    }
    return Tls(SSL_read(ssl_, data, static_cast<int>(n)));
  }

 private:
  explicit Transport(int fd) : fd_(fd) {}

  ssize_t Tls(int r) {
    if (r > 0) return r;
    const int e = SSL_get_error(ssl_, r);
    ERR_clear_error();
    return e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE ? 0 : -1;
  }

  const int fd_;
  SSL* ssl_ = nullptr;
};

class Connection {
 public:
  explicit Connection(std::unique_ptr<Transport> transport)
      : transport_(std::move(transport)) {}

  int fd() const { return transport_->fd(); }
  bool done() const { return done_; }
  bool wants_write() const { return !out_.empty(); }

  // The preface, SETTINGS, and the streams.
  void Open(const HeldRequestOptions& o) {
    options_ = &o;
    headers_ = RequestHeaders(o.path);
    out_ = kH2Preface;
    AppendFrame(kH2Settings, 0, 0, "", &out_);
    if (o.reset_at_once || o.idle_frames) return;
    if (o.endless_headers) {
      AppendFrame(kH2Headers, 0, 1, headers_, &out_);  // no END_HEADERS
      return;
    }
    for (int i = 0; i < o.streams; ++i) OpenStream();
  }

  // Queues DATA within the windows, taking from *budget; or, when the
  // calls are reset, new calls and their resets.
  void Fill(int64_t* budget, HeldRequestResult* result) {
    if (options_->reset_at_once) {
      while (out_.size() < kQueueBytes && next_id_ < (1u << 30)) {
        const uint32_t id = next_id_;
        next_id_ += 2;
        AppendFrame(kH2Headers, kH2EndHeaders, id, headers_, &out_);
        AppendFrame(kH2RstStream, 0, id, std::string("\0\0\0\x08", 4),
                    &out_);  // CANCEL
        ++result->calls_reset;
      }
      return;
    }
    if (options_->idle_frames) {
      // The connection's window one byte larger; stream 1's priority.
      static const std::string kIdle =
          H2Frame(kH2WindowUpdate, 0, 0, std::string("\0\0\0\x01", 4)) +
          H2Frame(kH2Priority, 0, 1, std::string("\0\0\0\0\x0f", 5));
      while (out_.size() < kQueueBytes && *budget > 0) {
        out_ += kIdle;
        *budget -= kIdle.size();
        result->sent_bytes += kIdle.size();
      }
      return;
    }
    if (options_->endless_headers) {
      // Literal header fields of 4000 bytes, 4 to a CONTINUATION frame.
      static const std::string kFields = [] {
        std::string field;
        field.push_back(0);
        AppendHpackString("x-pad", &field);
        AppendHpackString(std::string(4000, 'a'), &field);
        std::string four;
        for (int i = 0; i < 4; ++i) four += field;
        return four;
      }();
      if (options_->header_frame_bytes > 0) {
        // One literal field whose name is 1 GiB long, its bytes
        // header_frame_bytes to a frame: gRPC holds the name read so far.
        static const std::string kLongName = [] {
          std::string start = "\x40\x7f";  // new name, length >= 127
          for (uint64_t v = (uint64_t{1} << 30) - 127;; v >>= 7) {
            start.push_back(
                static_cast<char>((v & 127) | (v >= 128 ? 128 : 0)));
            if (v < 128) break;
          }
          return start;
        }();
        const size_t frame = static_cast<size_t>(options_->header_frame_bytes);
        while (out_.size() < kQueueBytes && *budget > 0) {
          std::string piece;
          for (; piece.size() < frame; ++fields_at_) {
            piece.push_back(
                fields_at_ < kLongName.size() ? kLongName[fields_at_] : 'a');
          }
          AppendFrame(kH2Continuation, 0, 1, piece, &out_);
          *budget -= piece.size();
          result->sent_bytes += piece.size();
        }
        return;
      }
      while (out_.size() < kQueueBytes && *budget > 0) {
        AppendFrame(kH2Continuation, 0, 1, kFields, &out_);
        *budget -= kFields.size();
        result->sent_bytes += kFields.size();
      }
      return;
    }
    static const std::string kZeros(64 << 10, '\0');
    bool progressed = true;
    while (progressed && out_.size() < kQueueBytes && *budget > 0) {
      progressed = false;
      for (auto& [id, s] : streams_) {
        const int64_t n =
            std::min({s.remaining, s.window, conn_window_,
                      static_cast<int64_t>(max_frame_),
                      static_cast<int64_t>(kZeros.size()), *budget});
        if (n <= 0) continue;
        AppendFrame(kH2Data, 0, id, kZeros.substr(0, n), &out_);
        s.window -= n;
        s.remaining -= n;
        conn_window_ -= n;
        *budget -= n;
        result->sent_bytes += n;
        progressed = true;
      }
    }
  }

  void Write(HeldRequestResult* result) {
    while (!out_.empty()) {
      const ssize_t n = transport_->Send(out_.data(), out_.size());
      if (n == 0) return;
      if (n < 0) {
        Close(result);
        return;
      }
      out_.erase(0, n);
    }
  }

  // Everything there is to read (TLS may hold decrypted bytes the socket
  // no longer shows).
  void Read(HeldRequestResult* result) {
    char buf[64 << 10];
    for (;;) {
      const ssize_t n = transport_->Receive(buf, sizeof(buf));
      if (n == 0) break;
      if (n < 0) {
        Close(result);
        return;
      }
      in_.append(buf, n);
    }
    while (in_.size() >= 9) {
      const size_t len = (size_t{static_cast<uint8_t>(in_[0])} << 16) |
                         (size_t{static_cast<uint8_t>(in_[1])} << 8) |
                         static_cast<uint8_t>(in_[2]);
      if (in_.size() < 9 + len) break;
      Handle(static_cast<uint8_t>(in_[3]), static_cast<uint8_t>(in_[4]),
             ReadU32(in_, 5) & 0x7fffffff, in_.substr(9, len), result);
      in_.erase(0, 9 + len);
    }
  }

 private:
  void Handle(uint8_t type, uint8_t flags, uint32_t id,
              const std::string& payload, HeldRequestResult* result) {
    if (type == kH2Settings && !(flags & kH2Ack)) {
      for (size_t at = 0; at + 6 <= payload.size(); at += 6) {
        const int key = (static_cast<uint8_t>(payload[at]) << 8) |
                        static_cast<uint8_t>(payload[at + 1]);
        const uint32_t value = ReadU32(payload, at + 2);
        if (key == 4) {  // SETTINGS_INITIAL_WINDOW_SIZE
          for (auto& [sid, s] : streams_) s.window += value - initial_window_;
          initial_window_ = value;
        } else if (key == 5) {  // SETTINGS_MAX_FRAME_SIZE
          max_frame_ = value;
        }
      }
      // Nothing may come between a header block's frames.
      if (!options_->endless_headers) {
        AppendFrame(kH2Settings, kH2Ack, 0, "", &out_);
      }
    } else if (type == kH2Ping && !(flags & kH2Ack)) {
      if (!options_->endless_headers) {
        AppendFrame(kH2Ping, kH2Ack, 0, payload, &out_);
      }
    } else if (type == kH2WindowUpdate && payload.size() == 4) {
      const int64_t inc = ReadU32(payload, 0) & 0x7fffffff;
      if (id == 0) {
        conn_window_ += inc;
      } else if (auto it = streams_.find(id); it != streams_.end()) {
        it->second.window += inc;
      }
    } else if (type == kH2RstStream) {
      if (streams_.erase(id) == 1 && !done_) OpenStream();  // one more
      ++result->streams_reset;
    } else if (type == kH2Goaway) {
      ++result->goaways;
      done_ = true;
    }
  }

  // A stream's headers and length prefix.
  void OpenStream() {
    const uint32_t id = next_id_;
    next_id_ += 2;
    AppendFrame(kH2Headers, kH2EndHeaders, id, headers_, &out_);
    const uint32_t d = options_->declared_bytes;
    const std::string prefix = {
        0, static_cast<char>(d >> 24), static_cast<char>(d >> 16),
        static_cast<char>(d >> 8), static_cast<char>(d)};
    AppendFrame(kH2Data, 0, id, prefix, &out_);
    Stream& s = streams_[id];
    s.window = initial_window_ - 5;
    s.remaining = int64_t{d} - 1;  // never all of it
    conn_window_ -= 5;
  }

  void Close(HeldRequestResult* result) {
    if (!done_) ++result->closed;
    done_ = true;
    out_.clear();
  }

  std::unique_ptr<Transport> transport_;
  const HeldRequestOptions* options_ = nullptr;
  std::string headers_;
  uint32_t next_id_ = 1;
  bool done_ = false;
  std::string out_, in_;
  // endless_headers in small frames: the next byte of its long field.
  uint64_t fields_at_ = 0;
  std::map<uint32_t, Stream> streams_;
  int64_t conn_window_ = kDefaultWindow;
  int64_t initial_window_ = kDefaultWindow;
  uint32_t max_frame_ = 16384;
};

absl::StatusOr<int> Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot connect to 127.0.0.1:", port));
  }
  return fd;
}

}  // namespace

absl::StatusOr<HeldRequestResult> HoldRequests(
    const HeldRequestOptions& options) {
  NoSigpipe no_sigpipe;  // TLS writes to connections the server closed
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> tls(nullptr, &SSL_CTX_free);
  if (options.tls) {
    tls.reset(SSL_CTX_new(TLS_client_method()));
    SSL_CTX_set_verify(tls.get(), SSL_VERIFY_NONE, nullptr);
    static const unsigned char kAlpn[] = {2, 'h', '2'};
    SSL_CTX_set_alpn_protos(tls.get(), kAlpn, sizeof(kAlpn));
    SSL_CTX_set_mode(tls.get(), SSL_MODE_ENABLE_PARTIAL_WRITE |
                                    SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  }
  std::vector<std::unique_ptr<Connection>> conns;
  for (int i = 0; i < options.connections; ++i) {
    absl::StatusOr<int> fd = Connect(options.port);
    if (!fd.ok()) return fd.status();
    absl::StatusOr<std::unique_ptr<Transport>> transport =
        Transport::Open(*fd, tls.get());
    if (!transport.ok()) return transport.status();
    conns.push_back(std::make_unique<Connection>(*std::move(transport)));
    conns.back()->Open(options);
  }
  HeldRequestResult result;
  int64_t budget = options.max_bytes;
  const absl::Time end = absl::Now() + options.hold;
  std::vector<pollfd> fds(conns.size());
  while (absl::Now() < end) {
    for (size_t i = 0; i < conns.size(); ++i) {
      if (!conns[i]->done()) conns[i]->Fill(&budget, &result);
      fds[i] = {conns[i]->done() ? -1 : conns[i]->fd(),
                static_cast<int16_t>(POLLIN |
                                     (conns[i]->wants_write() ? POLLOUT : 0)),
                0};
    }
    if (poll(fds.data(), fds.size(), 20) <= 0) continue;
    for (size_t i = 0; i < conns.size(); ++i) {
      if (fds[i].revents & (POLLIN | POLLERR | POLLHUP)) {
        conns[i]->Read(&result);
      }
      if (!conns[i]->done()) conns[i]->Write(&result);
    }
  }
  return result;
}

}  // namespace testing
}  // namespace asyncps
