#include "common/payload.h"

#include <algorithm>

#include "absl/base/attributes.h"

namespace asyncps {
namespace {

// True when none of n wire values has an all-ones exponent (Inf or NaN).
// Reads the exponent bits, so the loop vectorizes without -ffast-math:
// (bits & kExponent) + kCarry carries into the top bit only for an all-ones
// exponent. Sixteen independent accumulators keep the vector units busy
// instead of waiting on one OR chain.
// Always inlined, so that each variant of AllFinite compiles it for its own
// instruction set.
template <typename Bits, Bits kExponent, Bits kCarry>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool NoAllOnesExponent(const char* bytes,
                                                           size_t n) {
  constexpr size_t kLanes = 16;
  constexpr Bits kTop = static_cast<Bits>(Bits{1} << (8 * sizeof(Bits) - 1));
  Bits acc[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t k = 0; k < kLanes; ++k) {
      Bits bits;
      std::memcpy(&bits, bytes + (i + k) * sizeof(Bits), sizeof(bits));
      acc[k] |= static_cast<Bits>((bits & kExponent) + kCarry);
    }
  }
  Bits bad = 0;
  for (size_t k = 0; k < kLanes; ++k) bad |= acc[k];
  for (; i < n; ++i) {
    Bits bits;
    std::memcpy(&bits, bytes + i * sizeof(Bits), sizeof(bits));
    bad |= static_cast<Bits>((bits & kExponent) + kCarry);
  }
  return (bad & kTop) == 0;
}

}  // namespace

void EncodeBf16(const float* values, size_t n, char* out) {
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = Bf16FromFloat(values[i]);
    std::memcpy(out + 2 * i, &h, sizeof(h));
  }
}

void DecodeBf16(const char* bytes, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = LoadWire<WIRE_BF16>(bytes, i);
}

// Every push is scanned twice over all its bytes (by the client, so that no
// shard applies part of a push another refuses, and by the shard): the
// scan is also compiled for AVX2 and the variant picked when the program
// loads (GCC's function multi-versioning). Measured on this project's
// machines: a 4 MiB gradient in cache about 18 GB/s with SSE2, 50-60 GB/s
// with AVX2; 64 MiB from memory 12 vs 15-17 GB/s.
__attribute__((target_clones("avx2", "default"))) bool AllFinite(
    const char* bytes, size_t n, WireDtype dtype) {
  if (dtype == WIRE_BF16) {
    return NoAllOnesExponent<uint16_t, 0x7f80u, 0x0080u>(bytes, n);
  }
  return NoAllOnesExponent<uint32_t, 0x7f800000u, 0x00800000u>(bytes, n);
}

bool AllFinite(const Payload& payload) {
  bool ok = true;
  ForEachValueRun(payload, [&](size_t, const char* bytes, size_t n) {
    ok = ok && AllFinite(bytes, n, payload.dtype());
  });
  return ok;
}

void DecodePayload(const Payload& payload, float* out) {
  ForEachValueRun(payload, [&](size_t first, const char* bytes, size_t n) {
    if (payload.dtype() == WIRE_BF16) {
      DecodeBf16(bytes, n, out + first);
    } else {
      std::memcpy(out + first, bytes, n * sizeof(float));
    }
  });
}

}  // namespace asyncps
