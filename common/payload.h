#ifndef ASYNCPS_COMMON_PAYLOAD_H_
#define ASYNCPS_COMMON_PAYLOAD_H_

// Float payloads as they travel: little-endian float32 (or bfloat16 on the
// fast data path when asked for), possibly in several pieces of gRPC's
// receive buffers, and the conversions between them.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

// asyncps targets little-endian hosts, where the wire encoding of a float32
// is its memory image.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "asyncps encodes floats as little-endian bytes");

// Bytes one value takes on the wire.
inline size_t WireBytes(WireDtype dtype) { return dtype == WIRE_BF16 ? 2 : 4; }

inline void EncodeFloats(const float* values, size_t n, std::string* out) {
  // assign() copies once; resize() + memcpy would zero-fill first.
  out->assign(reinterpret_cast<const char*>(values), n * sizeof(float));
}

// REQUIRES: bytes.size() >= n * sizeof(float).
inline void DecodeFloats(absl::string_view bytes, float* out, size_t n) {
  std::memcpy(out, bytes.data(), n * sizeof(float));
}

// bfloat16: the upper half of a float32, rounded to nearest even; NaN stays
// NaN (its quiet bit is set so that rounding cannot turn it into Inf).
inline uint16_t Bf16FromFloat(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

inline float FloatFromBf16(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// n floats to n bfloat16 values (2n bytes at out), and back.
void EncodeBf16(const float* values, size_t n, char* out);
void DecodeBf16(const char* bytes, size_t n, float* out);

// Reads value i of a run of wire bytes as a float (unaligned loads).
template <WireDtype kDtype>
inline float LoadWire(const char* bytes, size_t i) {
  if constexpr (kDtype == WIRE_BF16) {
    uint16_t h;
    std::memcpy(&h, bytes + 2 * i, sizeof(h));
    return FloatFromBf16(h);
  } else {
    float f;
    std::memcpy(&f, bytes + 4 * i, sizeof(f));
    return f;
  }
}

// The encoded values of one slice, possibly in several pieces: the fast data
// path reads payloads in place from gRPC's receive buffers, where a payload
// may span buffer boundaries (even in the middle of a value) and need not be
// aligned. Does not own the bytes; they must outlive it. A value type.
class Payload {
 public:
  Payload() = default;
  explicit Payload(absl::string_view bytes, WireDtype dtype = WIRE_F32)
      : dtype_(dtype) {
    Append(bytes);
  }

  void set_dtype(WireDtype dtype) { dtype_ = dtype; }
  WireDtype dtype() const { return dtype_; }

  void Append(absl::string_view piece) {
    if (piece.empty()) return;
    pieces_.push_back(piece);
    size_ += piece.size();
  }

  // Total bytes, and values (size() / WireBytes(dtype())).
  size_t size() const { return size_; }
  size_t count() const { return size_ / WireBytes(dtype_); }
  absl::Span<const absl::string_view> pieces() const { return pieces_; }

 private:
  WireDtype dtype_ = WIRE_F32;
  absl::InlinedVector<absl::string_view, 2> pieces_;
  size_t size_ = 0;
};

// Calls run(first, bytes, count) for consecutive runs of whole values of
// `payload` in order: `count` values starting at value index `first`, read
// from `bytes` (wire encoding, any alignment). A value split between two
// pieces is reassembled in a small buffer and handed over on its own, so
// runs never copy more than one value.
// REQUIRES: payload.size() is a multiple of WireBytes(payload.dtype()).
template <typename F>
void ForEachValueRun(const Payload& payload, F run) {
  const size_t width = WireBytes(payload.dtype());
  char carry[sizeof(float)];
  size_t have = 0;
  size_t next = 0;  // index of the next value
  for (absl::string_view piece : payload.pieces()) {
    const char* p = piece.data();
    size_t len = piece.size();
    if (have > 0) {
      const size_t take = std::min(width - have, len);
      std::memcpy(carry + have, p, take);
      have += take;
      p += take;
      len -= take;
      if (have < width) continue;
      run(next, static_cast<const char*>(carry), size_t{1});
      ++next;
      have = 0;
    }
    const size_t whole = len / width;
    if (whole > 0) run(next, p, whole);
    next += whole;
    have = len - whole * width;
    std::memcpy(carry, p + whole * width, have);
  }
}

// True when every value of `payload` is finite (no NaN, no Inf).
bool AllFinite(const Payload& payload);
// The same for n wire values of one dtype at `bytes` (any alignment).
bool AllFinite(const char* bytes, size_t n, WireDtype dtype);

// Copies the payload's values to out[0, count()) as floats.
void DecodePayload(const Payload& payload, float* out);

// The payloads of a protobuf push's gradient messages (SliceGradient or
// RowsGradient), in order: float32 views of each message's `grad` bytes,
// which must outlive them.
template <typename Gradient>
std::vector<Payload> GradPayloads(
    const google::protobuf::RepeatedPtrField<Gradient>& gradients) {
  std::vector<Payload> out;
  out.reserve(gradients.size());
  for (const Gradient& g : gradients) out.emplace_back(g.grad());
  return out;
}

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_PAYLOAD_H_
