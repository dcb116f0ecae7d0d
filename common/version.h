#ifndef ASYNCPS_COMMON_VERSION_H_
#define ASYNCPS_COMMON_VERSION_H_

namespace asyncps {

// Reported by every binary's --version and in the Status RPC.
inline constexpr char kVersion[] = "0.1.0";

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_VERSION_H_
