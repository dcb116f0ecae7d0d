#ifndef ASYNCPS_SERVER_ENTRY_WIRE_H_
#define ASYNCPS_SERVER_ENTRY_WIRE_H_

// A replication log entry on the Follow stream (proto/replication.proto)
// without copies of its payloads: the primary keeps a streamed push's
// gradients as slices of the request that brought them and sends them as
// the entry's `grads` / `rows` fields (EntryWire); a backup reads the
// FollowFeed back keeping those fields as slices of the stream's receive
// buffers (ReadFeedWire), applies from them, and keeps them in its own log.
// Either end also takes entries that hold their payloads inside, as plain
// protobuf serialization writes them: the bytes are the same.
//
// Example (a backup's read):
//
//   FollowFeed feed;
//   std::shared_ptr<const EntryPayloads> payloads;
//   absl::Status s = ReadFeedWire(&received, &feed, &payloads);
//   // feed.entry().grads() is empty when payloads is set.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "common/payload.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "proto/replication.pb.h"

namespace asyncps {

// A push's payloads kept outside its entry's message: slices that share
// the memory of the request or stream that brought them (small ones are
// copies: FrameReader::Keep), in the order of LogEntry.grads and
// LogEntry.rows.
struct EntryPayloads {
  std::vector<std::vector<grpc::Slice>> grads, rows;
};

// An entry as a log keeps it: the FollowFeed that carries it (its entry
// set, nothing else) and the payloads kept outside it, if any (null: the
// entry holds them). `feed` is null for "no entry yet"
// (ReplicationLog::Next).
struct KeptEntry {
  std::shared_ptr<const FollowFeed> feed;
  std::shared_ptr<const EntryPayloads> payloads;
};

// The bytes a kept entry holds: its message's and its outside payloads'.
uint64_t KeptBytes(const KeptEntry& kept);

// A view of one outside payload, of wire values of `dtype`.
Payload PayloadOf(const std::vector<grpc::Slice>& payload, WireDtype dtype);

// The entry's FollowFeed as sent to a backup: the message as serialized,
// with the outside payloads as its entry's grads and rows fields.
grpc::ByteBuffer EntryWire(const KeptEntry& kept);

// Reads one FollowFeed off the stream. When it carries an entry, its grads
// and rows go to *payloads (set only when there are some), the entry's
// other fields to feed->entry(); payloads of 16 KiB or more share the
// buffer's slices. Other messages (a snapshot's pieces) parse as they are.
// INVALID_ARGUMENT, with feed in an unspecified state, when the bytes are
// malformed. Empties `wire`.
absl::Status ReadFeedWire(grpc::ByteBuffer* wire, FollowFeed* feed,
                          std::shared_ptr<const EntryPayloads>* payloads);

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_ENTRY_WIRE_H_
