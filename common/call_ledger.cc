#include "common/call_ledger.h"

#include <algorithm>

namespace asyncps {
namespace {

constexpr uint8_t kData = 0x0, kHeaders = 0x1, kRstStream = 0x3,
                  kContinuation = 0x9;
constexpr uint8_t kEndStream = 0x1, kEndHeaders = 0x4, kPadded = 0x8;
// The client's connection preface (RFC 9113, 3.4), before its first frame.
constexpr char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
constexpr size_t kPrefaceBytes = sizeof(kPreface) - 1;
static_assert(kPrefaceBytes == 24, "CallLedger::client_ starts with it left");

}  // namespace

void CallLedger::FromClient(const char* data, size_t n) {
  while (n > 0 && !not_http2_) {
    const size_t used = Step(&client_, true, data, n);
    data += used;
    n -= used;
  }
}

void CallLedger::FromServer(const char* data, size_t n) {
  while (n > 0 && !not_http2_) {
    const size_t used = Step(&server_, false, data, n);
    data += used;
    n -= used;
  }
}

size_t CallLedger::Step(Frames* f, bool from_client, const char* data,
                        size_t n) {
  if (f->preface_left > 0) {
    const size_t skip = std::min(n, f->preface_left);
    const char* expected = kPreface + (kPrefaceBytes - f->preface_left);
    if (!std::equal(data, data + skip, expected)) {
      not_http2_ = true;
      return n;
    }
    f->preface_left -= skip;
    return skip;
  }
  if (f->payload_left == 0) {  // a frame header, perhaps in pieces
    const size_t take = std::min(n, sizeof(f->header) - f->header_len);
    std::copy(data, data + take, f->header + f->header_len);
    f->header_len += take;
    if (f->header_len == sizeof(f->header)) {
      f->header_len = 0;
      OnHeader(f, from_client);
    }
    return take;
  }
  const size_t take =
      static_cast<size_t>(std::min<uint64_t>(n, f->payload_left));
  const bool counted = from_client && f->type == kData;
  if (counted) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(data);
    size_t at = 0;
    if (f->pad_length_next) {
      f->pad_length_next = false;
      f->padding = std::min<uint64_t>(bytes[0], f->payload_left - 1);
      at = 1;
    }
    // The frame's data is what comes before its padding.
    const uint64_t data_left = f->payload_left > at + f->padding
                                   ? f->payload_left - at - f->padding
                                   : 0;
    const size_t usable =
        static_cast<size_t>(std::min<uint64_t>(take - at, data_left));
    auto it = calls_.find(f->stream);
    if (it != calls_.end() && usable > 0) {
      Message(&it->second, bytes + at, usable);
    }
  }
  f->payload_left -= take;
  if (f->payload_left == 0) OnFrameEnd(*f, from_client);
  return take;
}

void CallLedger::OnHeader(Frames* f, bool from_client) {
  const unsigned char* h = f->header;
  f->payload_left =
      (uint64_t{h[0]} << 16) | (uint64_t{h[1]} << 8) | uint64_t{h[2]};
  f->type = h[3];
  f->flags = h[4];
  f->stream = ((uint32_t{h[5]} << 24) | (uint32_t{h[6]} << 16) |
               (uint32_t{h[7]} << 8) | uint32_t{h[8]}) &
              0x7fffffff;
  f->padding = 0;
  f->pad_length_next =
      f->type == kData && (f->flags & kPadded) && f->payload_left > 0;
  if (from_client) CountFrame(*f);
  if (from_client && (f->type == kHeaders || f->type == kContinuation)) {
    const int64_t length = static_cast<int64_t>(f->payload_left);
    header_block_ += length;
    ++header_block_frames_;
    pending_ += length;
  }
  if (from_client && f->type == kHeaders && f->stream != 0 &&
      !calls_.contains(f->stream)) {
    calls_.emplace(f->stream, Call());
    pending_ += kCallBytes;
  }
  if (f->payload_left == 0) OnFrameEnd(*f, from_client);
}

void CallLedger::CountFrame(const Frames& f) {
  switch (f.type) {
    case kHeaders:
      ++client_work_frames_;
      break;
    case kData:
      if (f.payload_left > 0 || (f.flags & kEndStream)) {
        ++client_work_frames_;
      } else {
        ++client_idle_frames_;
      }
      break;
    case kRstStream:
    case kContinuation:
      break;  // resets and header blocks are bounded apart
    default:
      ++client_idle_frames_;
  }
}

void CallLedger::OnFrameEnd(const Frames& f, bool from_client) {
  if (from_client && (f.type == kHeaders || f.type == kContinuation) &&
      (f.flags & kEndHeaders)) {
    pending_ -= header_block_;  // gRPC has decoded the block
    header_block_ = 0;
    header_block_frames_ = 0;
  }
  if (f.stream == 0) return;  // the connection's own frames
  if (f.type == kRstStream) {
    if (from_client) ++client_resets_;
    End(f.stream);
  } else if (from_client) {
    // The client's END_STREAM: its request is whole.
    if ((f.type == kHeaders || f.type == kData) && (f.flags & kEndStream)) {
      End(f.stream);
    }
  } else if (f.type == kHeaders && (f.flags & kEndStream)) {
    End(f.stream);  // the server's trailers
  }
}

void CallLedger::Message(Call* call, const unsigned char* data, size_t n) {
  const int64_t before = call->held;
  while (n > 0) {
    if (call->prefix_len < 5) {
      const size_t take = std::min<size_t>(n, 5 - call->prefix_len);
      std::copy(data, data + take, call->prefix + call->prefix_len);
      call->prefix_len += take;
      call->held += take;
      data += take;
      n -= take;
      if (call->prefix_len < 5) break;
      const unsigned char* p = call->prefix;
      call->body_left = (uint64_t{p[1]} << 24) | (uint64_t{p[2]} << 16) |
                        (uint64_t{p[3]} << 8) | uint64_t{p[4]};
    } else {
      const size_t take =
          static_cast<size_t>(std::min<uint64_t>(n, call->body_left));
      call->body_left -= take;
      call->held += take;
      data += take;
      n -= take;
    }
    if (call->prefix_len == 5 && call->body_left == 0) {
      // A whole message: gRPC hands it to the handler.
      call->held = kCallBytes;
      call->prefix_len = 0;
    }
  }
  pending_ += call->held - before;
}

void CallLedger::End(uint32_t stream) {
  auto it = calls_.find(stream);
  if (it == calls_.end()) return;
  pending_ -= it->second.held;
  calls_.erase(it);
}

}  // namespace asyncps
