#ifndef ASYNCPS_TESTS_TESTING_SHARD_FUZZ_H_
#define ASYNCPS_TESTS_TESTING_SHARD_FUZZ_H_

// Every method a shard serves (the data path, SlotMoves, ReplicaFeed,
// health, reflection), fed random inputs as a black-box caller would send
// them (tests/testing/raw_calls.h).
//
// Example:
//
//   RandomWire input(1);
//   std::vector<std::string> bugs = FuzzShardMethods(address, &input, 120, 30);
//   CHECK(bugs.empty());

#include <string>
#include <vector>

#include "tests/testing/raw_calls.h"

namespace asyncps {
namespace testing {

// Sends each unary method `unary_inputs` inputs and each streaming method
// `streams` streams of 1-3 inputs, one call at a time (5 s deadline each).
// Returns one line per answer that reads as a bug in the shard (UNKNOWN,
// INTERNAL, DATA_LOSS), a hang (DEADLINE_EXCEEDED) or a shard gone
// (UNAVAILABLE from gRPC, not the shard's own): method, input and status.
std::vector<std::string> FuzzShardMethods(const std::string& address,
                                          RandomWire* input, int unary_inputs,
                                          int streams);

}  // namespace testing
}  // namespace asyncps

#endif  // ASYNCPS_TESTS_TESTING_SHARD_FUZZ_H_
