#ifndef ASYNCPS_TESTS_TESTING_SLICES_H_
#define ASYNCPS_TESTS_TESTING_SLICES_H_

// The bytes of gRPC slices, joined, for tests that check what a payload
// split into pieces holds:
//
//   CHECK(testing::JoinSlices(part.payload) == expected_bytes);

#include <grpcpp/support/slice.h>

#include <string>
#include <vector>

namespace asyncps {
namespace testing {

inline std::string JoinSlices(const std::vector<grpc::Slice>& slices) {
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

}  // namespace testing
}  // namespace asyncps

#endif  // ASYNCPS_TESTS_TESTING_SLICES_H_
