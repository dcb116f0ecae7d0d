#ifndef ASYNCPS_COMMON_FLOAT_CODEC_H_
#define ASYNCPS_COMMON_FLOAT_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace asyncps {

// Payloads on the wire are float32 in little-endian byte order (see
// proto/asyncps.proto). asyncps targets little-endian hosts, where encoding
// is a plain memcpy.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "asyncps encodes floats as little-endian bytes");

inline void EncodeFloats(const float* values, size_t n, std::string* out) {
  // assign() copies once; resize() + memcpy would zero-fill first.
  out->assign(reinterpret_cast<const char*>(values), n * sizeof(float));
}

// Number of floats in an encoded payload; SIZE_MAX when the byte length is
// not a multiple of sizeof(float).
inline size_t EncodedFloatCount(absl::string_view bytes) {
  return bytes.size() % sizeof(float) == 0 ? bytes.size() / sizeof(float)
                                           : static_cast<size_t>(-1);
}

// REQUIRES: EncodedFloatCount(bytes) == n.
inline void DecodeFloats(absl::string_view bytes, float* out, size_t n) {
  std::memcpy(out, bytes.data(), n * sizeof(float));
}

// The encoded bytes of one float32 payload, possibly in several pieces: the
// fast data path reads gradients in place from gRPC's receive buffers, where
// a payload may span buffer boundaries (even in the middle of a float) and
// need not be aligned. Does not own the bytes; they must outlive it.
class FloatPayload {
 public:
  FloatPayload() = default;
  explicit FloatPayload(absl::string_view bytes) { Append(bytes); }

  void Append(absl::string_view piece) {
    if (piece.empty()) return;
    pieces_.push_back(piece);
    size_ += piece.size();
  }

  // Total bytes.
  size_t size() const { return size_; }
  absl::Span<const absl::string_view> pieces() const { return pieces_; }

  // The floats as one aligned array: the bytes themselves when they are a
  // single aligned piece, else a copy in *scratch.
  // REQUIRES: size() % sizeof(float) == 0.
  const float* Floats(std::vector<float>* scratch) const {
    if (pieces_.size() == 1 &&
        reinterpret_cast<uintptr_t>(pieces_[0].data()) % alignof(float) == 0) {
      return reinterpret_cast<const float*>(pieces_[0].data());
    }
    scratch->resize(size_ / sizeof(float));
    char* out = reinterpret_cast<char*>(scratch->data());
    for (absl::string_view p : pieces_) {
      std::memcpy(out, p.data(), p.size());
      out += p.size();
    }
    return scratch->data();
  }

 private:
  absl::InlinedVector<absl::string_view, 2> pieces_;
  size_t size_ = 0;
};

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_FLOAT_CODEC_H_
