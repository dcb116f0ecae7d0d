#ifndef ASYNCPS_TESTS_TESTING_HELD_REQUESTS_H_
#define ASYNCPS_TESTS_TESTING_HELD_REQUESTS_H_

// gRPC calls whose requests never finish, spoken in HTTP/2 over TCP (plain,
// or over TLS with `tls`):
// each stream declares a request of `declared_bytes` in its gRPC length
// prefix, then sends as much of it as the server's flow-control windows
// allow (acknowledging its SETTINGS and PINGs, as a live client does, so
// keepalive does not close the connection), and never the rest; a stream
// the server resets is replaced by a new one. gRPC keeps what arrived until
// the whole request has; this measures what that costs a server. Or calls
// reset as soon as they are opened (reset_at_once), a header block that
// never ends (endless_headers), or frames that do nothing (idle_frames).

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace asyncps {
namespace testing {

struct HeldRequestOptions {
  int port = 0;  // on 127.0.0.1
  int connections = 1;
  int streams = 1;  // per connection
  std::string path = "/asyncps.ParameterServer/Push";
  uint32_t declared_bytes = 1 << 20;
  // Stops sending once this many bytes went out, all connections together.
  int64_t max_bytes = int64_t{1} << 30;
  // How long the connections stay open (sending, then holding).
  absl::Duration hold = absl::Seconds(5);
  // Instead: open calls and reset each right after its headers, as fast
  // as the connection takes them ("rapid reset").
  bool reset_at_once = false;
  // Instead: one call whose header block never ends (HEADERS without
  // END_HEADERS, then CONTINUATION frames up to max_bytes).
  bool endless_headers = false;
  // With endless_headers: CONTINUATION frames of this many bytes of one
  // field whose name never ends (0: four 4000-byte fields to a frame).
  int header_frame_bytes = 0;
  // Instead: frames that do no call's work (WINDOW_UPDATE and PRIORITY)
  // as fast as the connection takes them, up to max_bytes.
  bool idle_frames = false;
  // Over TLS (ALPN h2; the server's certificate is not checked, as an
  // attacker would not).
  bool tls = false;
};

struct HeldRequestResult {
  int64_t sent_bytes = 0;   // request bytes written, prefixes included
  int streams_reset = 0;    // RST_STREAM frames from the server
  int goaways = 0;          // connections the server sent GOAWAY on
  int closed = 0;           // connections the server closed
  int64_t calls_reset = 0;  // by this side, with reset_at_once
};

// Runs the calls for `options.hold`, then closes every connection.
// Fails only when a connection cannot be made at all.
absl::StatusOr<HeldRequestResult> HoldRequests(
    const HeldRequestOptions& options);

}  // namespace testing
}  // namespace asyncps

#endif  // ASYNCPS_TESTS_TESTING_HELD_REQUESTS_H_
