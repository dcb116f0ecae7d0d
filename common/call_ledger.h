#ifndef ASYNCPS_COMMON_CALL_LEDGER_H_
#define ASYNCPS_COMMON_CALL_LEDGER_H_

// What one HTTP/2 connection's client has made a gRPC server hold in
// messages it has not finished sending, read from the bytes that pass in
// each direction: frame headers, and in the client's DATA the 5-byte gRPC
// message prefixes (message bodies are skipped, no header block is decoded).
//
// A call opens with the client's HEADERS and ends with the client's
// END_STREAM (on HEADERS or DATA), a RST_STREAM from either side, or the
// server's trailers (HEADERS with END_STREAM). While it is open it counts
// kCallBytes plus the bytes of its current message so far: gRPC keeps a
// message's bytes until all of it has arrived, before any handler or size
// check runs (and opens the stream's window to the size the prefix
// announces). A whole message no longer counts; the handler has it. A
// header block counts until its END_HEADERS.
//
// Thread-compatible.

#include <cstddef>
#include <cstdint>

#include "absl/container/flat_hash_map.h"

namespace asyncps {

class CallLedger {
 public:
  // What an open call costs beyond its message bytes (gRPC's call state).
  static constexpr int64_t kCallBytes = 4096;

  // Bytes as they pass from the client to the server, and back.
  void FromClient(const char* data, size_t n);
  void FromServer(const char* data, size_t n);

  // kCallBytes per open call plus the bytes of unfinished messages.
  int64_t pending() const { return pending_; }
  size_t open_calls() const { return calls_.size(); }
  // RST_STREAM frames the client sent for calls, all told.
  uint64_t client_resets() const { return client_resets_; }
  // The client's frames that do no call's work (WINDOW_UPDATE, PING,
  // SETTINGS, PRIORITY, GOAWAY, unknown types, empty DATA that does not
  // end its stream), and those that do (HEADERS, DATA with bytes or
  // END_STREAM), all told. gRPC parses each; a client sending nothing else
  // keeps a core busy (RST_STREAM and CONTINUATION are counted apart).
  uint64_t client_idle_frames() const { return client_idle_frames_; }
  uint64_t client_work_frames() const { return client_work_frames_; }
  // Bytes of the client's header block in progress (a HEADERS frame and
  // the CONTINUATION frames after it, until END_HEADERS), which gRPC holds
  // whole; also counted in pending().
  int64_t header_block() const { return header_block_; }
  // Frames of that block so far (the HEADERS frame and its CONTINUATION
  // frames): gRPC 1.51's HPACK parser copies the block read so far once
  // per frame (CVE-2023-33953), so many small frames cost it quadratic
  // time.
  int header_block_frames() const { return header_block_frames_; }
  // The client's first bytes were not the HTTP/2 connection preface (a TLS
  // handshake, or no HTTP/2 client at all): nothing is counted from then on.
  bool not_http2() const { return not_http2_; }

 private:
  // An open call and its current message.
  struct Call {
    int64_t held = kCallBytes;
    unsigned char prefix[5];
    int prefix_len = 0;
    uint64_t body_left = 0;  // of the current message, once its prefix is in
  };

  // One direction's frames: where the next header starts, and what is left
  // of the current frame.
  struct Frames {
    size_t preface_left = 0;  // the client's 24-byte connection preface
    unsigned char header[9];
    size_t header_len = 0;
    uint8_t type = 0, flags = 0;
    uint32_t stream = 0;
    uint64_t payload_left = 0;
    bool pad_length_next = false;  // a PADDED DATA frame's first byte
    uint64_t padding = 0;          // of the current frame, at its end
  };

  // Consumes the next frame header byte(s) or payload bytes of `f`;
  // returns how many of `n` were used.
  size_t Step(Frames* f, bool from_client, const char* data, size_t n);
  void OnHeader(Frames* f, bool from_client);
  void OnFrameEnd(const Frames& f, bool from_client);
  // Counts a client frame whose header is in (idle or work).
  void CountFrame(const Frames& f);
  // Message bytes of a client DATA frame for `call`.
  void Message(Call* call, const unsigned char* data, size_t n);
  void End(uint32_t stream);

  Frames client_{24};
  Frames server_{0};
  absl::flat_hash_map<uint32_t, Call> calls_;
  int64_t pending_ = 0;
  uint64_t client_resets_ = 0;
  uint64_t client_idle_frames_ = 0;
  uint64_t client_work_frames_ = 0;
  int64_t header_block_ = 0;
  int header_block_frames_ = 0;
  bool not_http2_ = false;
};

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_CALL_LEDGER_H_
