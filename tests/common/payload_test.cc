// The NaN/Inf scan every push goes through (client and shard), in both wire
// types: a non-finite value at any position (the vector body, its lanes,
// the scalar tail) is found, and every finite value (zeros, subnormals,
// the largest float) passes; the same through a Payload in pieces.

#include "common/payload.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace asyncps {
namespace {

const char* Bytes(const std::vector<float>& v) {
  return reinterpret_cast<const char*>(v.data());
}

TEST_CASE("AllFinite finds NaN and Inf at every position", "[payload]") {
  const float bad[] = {std::nanf(""), -std::nanf(""), INFINITY, -INFINITY};
  // 16-lane body twice plus a 7-value tail.
  const size_t n = 39;
  std::vector<float> v(n, 1.5f);
  REQUIRE(AllFinite(Bytes(v), n, WIRE_F32));
  for (float b : bad) {
    for (size_t i = 0; i < n; ++i) {
      v[i] = b;
      CAPTURE(b, i);
      REQUIRE_FALSE(AllFinite(Bytes(v), n, WIRE_F32));
      // Shorter scans that end before the bad value pass.
      REQUIRE(AllFinite(Bytes(v), i, WIRE_F32));
      v[i] = 1.5f;
    }
  }
}

TEST_CASE("AllFinite passes every finite value", "[payload]") {
  const std::vector<float> v = {0.0f,
                                -0.0f,
                                std::numeric_limits<float>::denorm_min(),
                                -std::numeric_limits<float>::min(),
                                std::numeric_limits<float>::max(),
                                std::numeric_limits<float>::lowest(),
                                1e-30f,
                                -3.0f};
  std::vector<float> many;
  for (int r = 0; r < 9; ++r) many.insert(many.end(), v.begin(), v.end());
  REQUIRE(AllFinite(Bytes(many), many.size(), WIRE_F32));
  REQUIRE(AllFinite(Bytes(many), 0, WIRE_F32));
}

TEST_CASE("AllFinite reads bfloat16 and payloads in pieces", "[payload]") {
  const size_t n = 37;
  std::vector<float> v(n, -2.25f);
  std::string bf16(2 * n, '\0');
  EncodeBf16(v.data(), n, bf16.data());
  REQUIRE(AllFinite(bf16.data(), n, WIRE_BF16));
  for (size_t i = 0; i < n; ++i) {
    std::string bad = bf16;
    const float inf = INFINITY;
    EncodeBf16(&inf, 1, bad.data() + 2 * i);
    CAPTURE(i);
    REQUIRE_FALSE(AllFinite(bad.data(), n, WIRE_BF16));
  }
  // A float32 payload cut inside a value: the value split between the two
  // pieces is checked too.
  v[9] = std::nanf("");
  const char* bytes = Bytes(v);
  Payload split;
  split.Append(absl::string_view(bytes, 38));  // 9.5 values
  split.Append(absl::string_view(bytes + 38, 4 * n - 38));
  REQUIRE_FALSE(AllFinite(split));
  v[9] = 1.0f;
  Payload fine;
  fine.Append(absl::string_view(bytes, 38));
  fine.Append(absl::string_view(bytes + 38, 4 * n - 38));
  REQUIRE(AllFinite(fine));
}

}  // namespace
}  // namespace asyncps
