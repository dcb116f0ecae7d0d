#ifndef ASYNCPS_TESTS_TESTING_H2_FRAMES_H_
#define ASYNCPS_TESTS_TESTING_H2_FRAMES_H_

// HTTP/2 frames written by hand, for tests that speak it on a plain socket.

#include <cstdint>
#include <string>

namespace asyncps {
namespace testing {

inline constexpr uint8_t kH2Data = 0, kH2Headers = 1, kH2Priority = 2,
                         kH2RstStream = 3, kH2Settings = 4, kH2Ping = 6,
                         kH2Goaway = 7, kH2WindowUpdate = 8,
                         kH2Continuation = 9;
inline constexpr uint8_t kH2Ack = 0x1, kH2EndStream = 0x1, kH2EndHeaders = 0x4;
inline constexpr char kH2Preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

// A frame: its 9-byte header, then `payload`.
inline std::string H2Frame(uint8_t type, uint8_t flags, uint32_t stream,
                           const std::string& payload) {
  const uint32_t n = payload.size();
  const char header[9] = {static_cast<char>(n >> 16),
                          static_cast<char>(n >> 8),
                          static_cast<char>(n),
                          static_cast<char>(type),
                          static_cast<char>(flags),
                          static_cast<char>(stream >> 24),
                          static_cast<char>(stream >> 16),
                          static_cast<char>(stream >> 8),
                          static_cast<char>(stream)};
  return std::string(header, 9) + payload;
}

}  // namespace testing
}  // namespace asyncps

#endif  // ASYNCPS_TESTS_TESTING_H2_FRAMES_H_
