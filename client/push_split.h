#ifndef ASYNCPS_CLIENT_PUSH_SPLIT_H_
#define ASYNCPS_CLIENT_PUSH_SPLIT_H_

// Routing parts of a push again by a newer shard map: when shards refuse
// their part of a push because it was routed with an older map
// (CallStatus.map), PsClient re-splits exactly those parts by the map they
// answered and sends the pieces under a fresh sequence number; the parts
// other shards applied are not sent again.
//
// Example:
//
//   PushPart refused{/*shard=*/1, header, payload};  // as sent to shard 1
//   absl::StatusOr<std::vector<PushPart>> parts =
//       SplitPushParts({refused}, newer_map);
//   if (!parts.ok()) return parts.status();  // header and payload disagree
//   for (PushPart& part : *parts) {
//     part.header.set_seq(fresh_seq);
//     part.header.set_map_epoch(newer_map.epoch());
//     Send(part.shard, MakeFrame(part.header, part.payload));
//   }
//
// Pure functions; thread-compatible.

#include <grpcpp/support/slice.h>

#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/shard_map.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

// One shard's part of a push as sent on the PushStream: its header (the
// SliceGradients and RowsGradients with their grad_bytes, no payload in the
// message) and its payload, every gradient's bytes in header order (slices
// first, then rows) in any number of pieces.
struct PushPart {
  int shard = 0;
  PushRequest header;
  std::vector<grpc::Slice> payload;
};

// The slices and rows of `parts` (the refused parts of one push) placed by
// `map`: one part per shard that owns any of them or that sent one of
// `parts` (it gets an empty part, so that it still sees the push's clock),
// in shard order. Each gets the header fields of parts[0] (worker, seq,
// wire type, assign, map epoch; set a fresh seq and the map's epoch before
// sending), and read_epoch: that of the part the shard sent itself, 0
// (unknown) for a shard that sent none. Gradients keep their read
// versions. Payload pieces share the parts' memory (no copy). A slice
// keeps its gradient bytes; a table's rows are cut per row (grad_bytes /
// ids). INVALID_ARGUMENT when a header and its payload disagree (sizes that
// do not add up, rows that do not divide), or a part's shard is out of the
// map's range.
absl::StatusOr<std::vector<PushPart>> SplitPushParts(
    absl::Span<const PushPart> parts, const ShardMap& map);

}  // namespace asyncps

#endif  // ASYNCPS_CLIENT_PUSH_SPLIT_H_
