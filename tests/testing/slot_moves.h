#ifndef ASYNCPS_TESTS_TESTING_SLOT_MOVES_H_
#define ASYNCPS_TESTS_TESTING_SLOT_MOVES_H_

// A live move asked of a shard's SlotMoves service directly, as psctl move
// does, for the tests that drive moves one by one.

#include <string>

#include "absl/time/clock.h"
#include "common/net.h"
#include "common/shard_map.h"
#include "common/shard_map_proto.h"
#include "proto/slot_moves.grpc.pb.h"

namespace asyncps {
namespace testing {

// MoveSlots asked of the shard at `destination`: the slots `next` gives it
// from shard `source_index` at `source`, with the run's map record at
// `keeper` ("" = the destination's own); the answer in *out if given.
inline grpc::Status MoveSlots(const std::string& destination,
                              const std::string& source, int source_index,
                              const ShardMap& next,
                              MoveSlotsResponse* out = nullptr,
                              const std::string& keeper = "",
                              absl::Duration timeout = absl::Seconds(60)) {
  MoveSlotsRequest request;
  request.set_source(source);
  request.set_source_index(source_index);
  request.set_destination(destination);
  request.set_keeper(keeper);
  ShardMapToProto(next, request.mutable_next_map());
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  MoveSlotsResponse r;
  return SlotMoves::NewStub(MakeChannel(destination))
      ->MoveSlots(&ctx, request, out != nullptr ? out : &r);
}

}  // namespace testing
}  // namespace asyncps

#endif  // ASYNCPS_TESTS_TESTING_SLOT_MOVES_H_
