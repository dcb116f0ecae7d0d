#ifndef ASYNCPS_COMMON_FLOAT_CODEC_H_
#define ASYNCPS_COMMON_FLOAT_CODEC_H_

#include <cstddef>
#include <cstring>
#include <string>

#include "absl/strings/string_view.h"

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

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_FLOAT_CODEC_H_
