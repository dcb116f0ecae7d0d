#ifndef ASYNCPS_COMMON_PARSE_COST_H_
#define ASYNCPS_COMMON_PARSE_COST_H_

// What parsing a request would cost in memory, read from its wire bytes
// before it is parsed. Protobuf's parser builds an object for every
// embedded message, string and unknown field, so a request of tiny repeated
// messages takes far more memory than its size: 64 MiB of empty
// SliceGradient entries (2 bytes each) made a shard allocate 2.8 GB. The
// estimate charges each embedded message, string or bytes field, repeated
// number and unknown field what the parsed form holds (object, heap block,
// pointer); CheckParseCost refuses a request whose estimate exceeds 16 MiB
// or 16x its size, whichever is more, and 1 GiB in any case.
//
// Example (before message->ParseFromArray(data, size)):
//
//   absl::Status s = CheckParseCost(absl::string_view(data, size),
//                                   *message->GetDescriptor());
//   if (!s.ok()) return s;  // RESOURCE_EXHAUSTED, nothing parsed

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"

namespace asyncps {

// Bytes the parsed form of `wire` (a `type` message) would hold, about;
// stops counting once past `stop`. Malformed wire data ends the count
// where it breaks (the parser refuses it then).
int64_t EstimateParseCost(absl::string_view wire,
                          const google::protobuf::Descriptor& type,
                          int64_t stop);

// OK, or RESOURCE_EXHAUSTED naming the request's size, the estimate and the
// limit.
absl::Status CheckParseCost(absl::string_view wire,
                            const google::protobuf::Descriptor& type);

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_PARSE_COST_H_
