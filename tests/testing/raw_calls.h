#ifndef ASYNCPS_TESTS_TESTING_RAW_CALLS_H_
#define ASYNCPS_TESTS_TESTING_RAW_CALLS_H_

// Calls of any gRPC method with bytes as they are (no message type), and
// random inputs for them: what a black-box caller sends.
//
// Example:
//
//   RandomWire input(7);
//   auto channel = grpc::CreateChannel(address,
//                                      grpc::InsecureChannelCredentials());
//   grpc::Status s = RawUnary(channel, "/asyncps.SlotMoves/MoveSlots",
//                             input.Next());

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace asyncps {
namespace testing {

// `bytes` as the request of unary `method` over `channel`: the call's
// status (the call is cancelled after `deadline_s`).
grpc::Status RawUnary(const std::shared_ptr<grpc::Channel>& channel,
                      const std::string& method, const std::string& bytes,
                      int deadline_s = 10);

// A call of streaming `method` that sends `messages`, is done sending and
// reads every answer (up to 1000): its status. Every step waits at most
// until the call's deadline.
grpc::Status RawStreaming(const std::shared_ptr<grpc::Channel>& channel,
                          const std::string& method,
                          const std::vector<std::string>& messages,
                          int deadline_s = 10);

// `bytes` of empty unknown fields (field 15, two bytes each): a request
// that parses (into any message type) but would take far more memory than
// its size, protobuf keeping an object for each.
std::string EmptyUnknownFields(size_t bytes);

// Random inputs from one seeded generator: plain bytes, protobuf wire data
// (1-8 fields of numbers 1-24, any wire type; length-delimited ones hold
// bytes, text, packed numbers or a nested message; now and then a length
// past the end), or such data cut short.
class RandomWire {
 public:
  explicit RandomWire(uint32_t seed) : rng_(seed) {}

  std::string Next();

 private:
  uint64_t Below(uint64_t n);
  std::string Bytes(size_t n);
  uint64_t Number();  // small and edge numbers, any 64 bits
  std::string Message(int depth);

  std::mt19937 rng_;
};

}  // namespace testing
}  // namespace asyncps

#endif  // ASYNCPS_TESTS_TESTING_RAW_CALLS_H_
