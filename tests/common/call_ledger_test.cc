// CallLedger: what a client holds in unfinished requests, read from frame
// headers however the bytes are split.

#include "common/call_ledger.h"

#include <catch2/catch.hpp>
#include <string>

#include "tests/testing/h2_frames.h"

namespace asyncps {
namespace {

using testing::H2Frame;
using testing::kH2Data;
using testing::kH2EndHeaders;
using testing::kH2EndStream;
using testing::kH2Headers;
using testing::kH2Ping;
using testing::kH2Preface;
using testing::kH2Priority;
using testing::kH2RstStream;
using testing::kH2Settings;
using testing::kH2WindowUpdate;

constexpr int64_t kCall = CallLedger::kCallBytes;

// Feeds `bytes` from the client `step` bytes at a time.
void FromClient(CallLedger* ledger, const std::string& bytes, size_t step) {
  for (size_t at = 0; at < bytes.size(); at += step) {
    const std::string piece = bytes.substr(at, step);
    ledger->FromClient(piece.data(), piece.size());
  }
}

TEST_CASE("unfinished requests count until their END_STREAM", "[call_ledger]") {
  for (size_t step : {size_t{1}, size_t{7}, size_t{1} << 20}) {
    INFO("step " << step);
    CallLedger ledger;
    std::string bytes = kH2Preface;
    bytes += H2Frame(kH2Settings, 0, 0, std::string(12, '\0'));
    bytes += H2Frame(kH2Headers, kH2EndHeaders, 1, "hdrs");
    bytes += H2Frame(kH2Data, 0, 1, std::string(1000, 'x'));
    bytes += H2Frame(kH2Headers, kH2EndHeaders, 3, "hdrs");
    bytes += H2Frame(kH2Data, 0, 3, std::string(300, 'y'));
    FromClient(&ledger, bytes, step);
    CHECK(ledger.open_calls() == 2);
    CHECK(ledger.pending() == 2 * kCall + 1300);
    // Stream 1's request is finished: the handler has it.
    FromClient(&ledger, H2Frame(kH2Data, kH2EndStream, 1, "zz"), step);
    CHECK(ledger.open_calls() == 1);
    CHECK(ledger.pending() == kCall + 300);
    // A request in one HEADERS frame with END_STREAM holds nothing after.
    FromClient(&ledger,
               H2Frame(kH2Headers, kH2EndHeaders | kH2EndStream, 5, "h"), step);
    CHECK(ledger.pending() == kCall + 300);
    // DATA on a stream never opened is gRPC's to refuse: not counted.
    FromClient(&ledger, H2Frame(kH2Data, 0, 9, std::string(50, 'q')), step);
    CHECK(ledger.pending() == kCall + 300);
  }
}

// A gRPC message: its 5-byte prefix announcing `length`, then `body`.
std::string Message(uint32_t length, const std::string& body) {
  const char prefix[5] = {
      0, static_cast<char>(length >> 24), static_cast<char>(length >> 16),
      static_cast<char>(length >> 8), static_cast<char>(length)};
  return std::string(prefix, 5) + body;
}

TEST_CASE(
    "on a stream that goes on, only the message not yet whole counts, "
    "across frames and padding",
    "[call_ledger]") {
  for (size_t step : {size_t{1}, size_t{3}, size_t{1} << 20}) {
    INFO("step " << step);
    CallLedger ledger;
    // A whole 10-byte message, then 4 bytes of a 100-byte one, split over
    // two DATA frames.
    const std::string stream =
        Message(10, std::string(10, 'a')) + Message(100, std::string(4, 'b'));
    std::string bytes = kH2Preface;
    bytes += H2Frame(kH2Headers, kH2EndHeaders, 1, "hdrs");
    bytes += H2Frame(kH2Data, 0, 1, stream.substr(0, 12));
    bytes += H2Frame(kH2Data, 0, 1, stream.substr(12));
    FromClient(&ledger, bytes, step);
    CHECK(ledger.pending() == kCall + 5 + 4);
    // A PADDED frame (pad length 3) finishes it: the padding is no message.
    const std::string padded =
        std::string(1, '\3') + std::string(96, 'b') + std::string(3, '\0');
    FromClient(&ledger, H2Frame(kH2Data, 0x8, 1, padded), step);
    CHECK(ledger.pending() == kCall);
    CHECK(ledger.open_calls() == 1);
    // The next message's prefix arrives in a frame of its own.
    FromClient(&ledger, H2Frame(kH2Data, 0, 1, Message(1 << 20, "")), step);
    CHECK(ledger.pending() == kCall + 5);
  }
}

TEST_CASE("a reset from either side or the server's trailers end a call",
          "[call_ledger]") {
  CallLedger ledger;
  std::string bytes = kH2Preface;
  for (uint32_t id : {1u, 3u, 5u}) {
    bytes += H2Frame(kH2Headers, kH2EndHeaders, id, "hdrs");
    bytes += H2Frame(kH2Data, 0, id, std::string(100, 'x'));
  }
  ledger.FromClient(bytes.data(), bytes.size());
  REQUIRE(ledger.pending() == 3 * (kCall + 100));
  const std::string reset = H2Frame(kH2RstStream, 0, 1, std::string(4, '\0'));
  ledger.FromClient(reset.data(), reset.size());
  CHECK(ledger.pending() == 2 * (kCall + 100));
  CHECK(ledger.client_resets() == 1);
  // The server: SETTINGS, a reset of 3, response headers of 5 (not the
  // end), then 5's trailers.
  std::string back = H2Frame(kH2Settings, 0, 0, "");
  back += H2Frame(kH2RstStream, 0, 3, std::string(4, '\0'));
  back += H2Frame(kH2Headers, kH2EndHeaders, 5, "resp");
  ledger.FromServer(back.data(), back.size());
  CHECK(ledger.pending() == kCall + 100);
  const std::string trailers =
      H2Frame(kH2Headers, kH2EndHeaders | kH2EndStream, 5, "trl");
  ledger.FromServer(trailers.data(), trailers.size());
  CHECK(ledger.pending() == 0);
  CHECK(ledger.open_calls() == 0);
  CHECK(ledger.client_resets() == 1);  // the server's resets are its own
}

TEST_CASE("a header block counts until its END_HEADERS", "[call_ledger]") {
  using testing::kH2Continuation;
  CallLedger ledger;
  std::string bytes = kH2Preface;
  bytes += H2Frame(kH2Headers, 0, 1, std::string(100, 'h'));
  bytes += H2Frame(kH2Continuation, 0, 1, std::string(300, 'c'));
  FromClient(&ledger, bytes, 7);
  CHECK(ledger.header_block() == 400);
  CHECK(ledger.header_block_frames() == 2);
  CHECK(ledger.pending() == kCall + 400);
  FromClient(&ledger, H2Frame(kH2Continuation, kH2EndHeaders, 1, "cc"), 7);
  CHECK(ledger.header_block() == 0);
  CHECK(ledger.header_block_frames() == 0);
  CHECK(ledger.pending() == kCall);
  // The server's header blocks are its own.
  const std::string back = H2Frame(kH2Headers, 0, 1, std::string(50, 'r'));
  ledger.FromServer(back.data(), back.size());
  CHECK(ledger.header_block() == 0);
}

TEST_CASE(
    "a client that does not begin with the HTTP/2 preface is not read as "
    "frames",
    "[call_ledger]") {
  // The start of a TLS ClientHello of 0x0120 bytes: as a frame header it
  // reads as a HEADERS frame of 1.4 MB without END_HEADERS, which had the
  // shard's guard cut healthy TLS connections.
  std::string hello = {0x16, 0x03, 0x01, 0x01, 0x20, 0x01, 0x00, 0x01, 0x1c};
  hello += std::string(0x120 - 4, '\x5a');
  for (size_t step : {size_t{1}, size_t{3}, size_t{1} << 20}) {
    INFO("step " << step);
    CallLedger ledger;
    FromClient(&ledger, hello, step);
    CHECK(ledger.not_http2());
    CHECK(ledger.header_block() == 0);
    CHECK(ledger.pending() == 0);
    CHECK(ledger.client_idle_frames() + ledger.client_work_frames() == 0);
    // Nothing after it counts either, whichever way it goes.
    const std::string call = H2Frame(kH2Headers, kH2EndHeaders, 1, "h");
    FromClient(&ledger, call, step);
    ledger.FromServer(call.data(), call.size());
    CHECK(ledger.open_calls() == 0);
    CHECK(ledger.pending() == 0);
  }
  // A preface that goes wrong past its first bytes is no HTTP/2 either.
  CallLedger almost;
  std::string bytes = kH2Preface;
  bytes[20] = 'X';
  FromClient(&almost, bytes + H2Frame(kH2Headers, kH2EndHeaders, 1, "h"), 5);
  CHECK(almost.not_http2());
  CHECK(almost.open_calls() == 0);
  // The real preface is.
  CallLedger real;
  FromClient(&real, kH2Preface + H2Frame(kH2Headers, kH2EndHeaders, 1, "h"), 5);
  CHECK_FALSE(real.not_http2());
  CHECK(real.open_calls() == 1);
}

TEST_CASE("the client's frames are told apart: work or idle", "[call_ledger]") {
  for (size_t step : {size_t{1}, size_t{5}, size_t{1} << 20}) {
    INFO("step " << step);
    CallLedger ledger;
    std::string bytes = kH2Preface;
    bytes += H2Frame(kH2Settings, 0, 0, "");                        // idle
    bytes += H2Frame(kH2Headers, kH2EndHeaders, 1, "h");            // work
    bytes += H2Frame(kH2Data, 0, 1, "");                            // idle
    bytes += H2Frame(kH2Data, 0, 1, std::string(10, 'x'));          // work
    bytes += H2Frame(kH2Data, kH2EndStream, 1, "");                 // work
    bytes += H2Frame(kH2WindowUpdate, 0, 0, std::string(4, '\1'));  // idle
    bytes += H2Frame(kH2Priority, 0, 3, std::string(5, '\0'));      // idle
    bytes += H2Frame(kH2Ping, 0, 0, std::string(8, '\0'));          // idle
    bytes += H2Frame(0x20, 0, 0, "unknown");                        // idle
    bytes += H2Frame(kH2RstStream, 0, 5, std::string(4, '\0'));     // apart
    FromClient(&ledger, bytes, step);
    CHECK(ledger.client_work_frames() == 3);
    CHECK(ledger.client_idle_frames() == 6);
    CHECK(ledger.client_resets() == 1);
    // The server's frames are not the client's.
    const std::string back =
        H2Frame(kH2WindowUpdate, 0, 0, std::string(4, '\1'));
    ledger.FromServer(back.data(), back.size());
    CHECK(ledger.client_idle_frames() == 6);
  }
}

}  // namespace
}  // namespace asyncps
