#ifndef ASYNCPS_COMMON_SHARD_MAP_PROTO_H_
#define ASYNCPS_COMMON_SHARD_MAP_PROTO_H_

// A shard map as it travels: in the answers of CreateTensor, ListTensors
// and Status (clients route by the map their shards serve), in checkpoint
// identities and spec files (a restore checks it), in the files psctl
// rebalance writes and psctl reshard --map reads.
//
// Example:
//
//   ShardMapProto wire;
//   ShardMapToProto(store.map(), &wire);
//   absl::StatusOr<ShardMap> back = ShardMapFromProto(wire);
//   if (!back.ok()) return back.status();  // a malformed map
//   assert(*back == store.map());

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/shard_map.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

void ShardMapToProto(const ShardMap& map, ShardMapProto* out);

// INVALID_ARGUMENT (saying what is wrong) for a map that is not one: a
// shard count or a slot count out of range, owners of another length than
// num_slots x 2 bytes, an owner beyond the shard count, epoch 0.
absl::StatusOr<ShardMap> ShardMapFromProto(const ShardMapProto& proto);

// The map of a message that may carry none: an unset map (num_shards 0) is
// the static map of `num_shards`.
absl::StatusOr<ShardMap> ShardMapOr(const ShardMapProto& proto, int num_shards);

// ShardMap::CheckRouted, and for a request routed with an older map, the
// refusal carries `map` (as a payload of the status, kRoutedMapPayload),
// which stream answers copy into CallStatus.map for the client; for one
// routed with a newer map, the epoch served (ServedMapEpoch).
//
//   absl::Status s = CheckRouted(store.map(), request.map_epoch());
//   ...
//   std::optional<ShardMapProto> newer = RefusalMap(s);  // set: re-route
absl::Status CheckRouted(const ShardMap& map, uint64_t routed);
// The map a refusal of CheckRouted (or one rebuilt with WithRefusalMap)
// carries; none for any other status.
std::optional<ShardMapProto> RefusalMap(const absl::Status& status);
// `status` carrying `map` as RefusalMap reads it.
absl::Status WithRefusalMap(absl::Status status, const ShardMapProto& map);
inline constexpr char kRoutedMapPayload[] = "asyncps.ShardMapProto/routed";

// For a request routed with a newer map than the shard serves, the refusal
// of CheckRouted (UNAVAILABLE) carries the epoch the shard serves (as a
// payload, kServedEpochPayload; stream answers copy it into
// CallStatus.served_map_epoch), so that a client holding the newer map can
// hand it to the shard (PsClient, as psctl adopt does); none for any other
// status.
std::optional<uint64_t> ServedMapEpoch(const absl::Status& status);
// `status` carrying `epoch` as ServedMapEpoch reads it.
absl::Status WithServedMapEpoch(absl::Status status, uint64_t epoch);
inline constexpr char kServedEpochPayload[] = "asyncps.ShardMap/served_epoch";

// The map as a text file (psctl rebalance writes one, psctl reshard --map
// reads one): the proto's text format, the owners as one line per shard
// listing its slots' ranges, so a person can read and edit it.
std::string ShardMapToText(const ShardMap& map);
absl::StatusOr<ShardMap> ShardMapFromText(const std::string& text);

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_SHARD_MAP_PROTO_H_
