#include "server/replica_feed.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace asyncps {

namespace {

constexpr size_t kPieceBytes = 1 << 20;

}  // namespace

std::string ReplicaId(absl::string_view address, uint64_t incarnation) {
  return absl::StrCat(address, "/", absl::Hex(incarnation));
}

absl::string_view ReplicaAddress(absl::string_view id) {
  const size_t slash = id.rfind('/');
  return slash == absl::string_view::npos ? id : id.substr(0, slash);
}

ReplicaFeedService::ReplicaFeedService(ReplicaFeedOptions options)
    : o_(std::move(options)) {}

absl::StatusOr<uint64_t> ReplicaFeedService::SendSnapshot(
    grpc::ServerReaderWriter<FollowFeed, FollowUp>* stream, uint64_t reader) {
  const absl::Time start = absl::Now();
  absl::StatusOr<FeedSnapshot> snapshot = o_.snapshot();
  if (!snapshot.ok()) return snapshot.status();
  o_.log->MoveReader(reader, snapshot->index);
  const std::string& bytes = snapshot->bytes;
  uint64_t sent = 0;
  do {
    const size_t n = std::min(kPieceBytes, bytes.size() - sent);
    FollowFeed feed;
    SnapshotFile* file = feed.mutable_file();
    file->set_name(snapshot->name);
    file->set_data(bytes.data() + sent, n);
    sent += n;
    file->set_last_piece(sent == bytes.size());
    if (!stream->Write(feed)) {
      return absl::UnavailableError("the backup went away during the snapshot");
    }
  } while (sent < bytes.size());
  FollowFeed end;
  end.mutable_snapshot_end()->set_index(snapshot->index);
  end.mutable_snapshot_end()->set_epoch(snapshot->epoch);
  end.mutable_snapshot_end()->set_shard_epoch(snapshot->shard_epoch);
  if (!stream->Write(end)) {
    return absl::UnavailableError("the backup went away during the snapshot");
  }
  const absl::Duration took = absl::Now() - start;
  o_.log->NoteSnapshot(sent, took);
  o_.logger->info(
      "sent a snapshot ({} bytes, at entry {}) to a backup in {} ({:.0f} MB/s)",
      sent, snapshot->index, absl::FormatDuration(took),
      sent / 1e6 / std::max(1e-6, absl::ToDoubleSeconds(took)));
  return snapshot->index;
}

grpc::Status ReplicaFeedService::Follow(
    grpc::ServerContext* ctx,
    grpc::ServerReaderWriter<FollowFeed, FollowUp>* stream) {
  FollowUp first;
  if (!stream->Read(&first) || !first.has_follow()) {
    return ToGrpcStatus(
        absl::InvalidArgumentError("a Follow stream starts with a follow"));
  }
  const FollowRequest& f = first.follow();
  if (f.run_id() != o_.run_id || f.shard_index() != o_.shard_index ||
      f.num_shards() != o_.num_shards || f.address().empty()) {
    return ToGrpcStatus(absl::FailedPreconditionError(
        absl::StrCat("this is shard ", o_.shard_index, "/", o_.num_shards,
                     " of run '", o_.run_id, "'; the follower asked for shard ",
                     f.shard_index(), "/", f.num_shards(), " of run '",
                     f.run_id(), "' (address '", f.address(), "')")));
  }
  if (!o_.log->primary()) {
    return ToGrpcStatus(
        absl::UnavailableError("this replica is not the primary"));
  }
  const std::string id = ReplicaId(f.address(), f.incarnation());
  if (o_.admits && !o_.admits(id)) {
    return ToGrpcStatus(absl::PermissionDeniedError(absl::StrCat(
        "replica ", id, " is not in shard ", o_.shard_index,
        "'s group in the shard map: it joins through the map first")));
  }
  uint64_t next = f.last_index();
  // Keeps the entries after the backup's position (or after the cut) while
  // it is sent the snapshot; moved on below.
  const uint64_t reader = o_.log->AddReader(o_.log->last_index());
  if (o_.log->CanContinue(f.last_index(), f.last_epoch())) {
    o_.log->Ack(id, f.last_index());
  } else {
    absl::StatusOr<uint64_t> cut = SendSnapshot(stream, reader);
    if (!cut.ok()) {
      o_.log->RemoveReader(reader);
      return ToGrpcStatus(cut.status());
    }
    next = *cut;
    // It holds the state up to the cut only once it stored and restored
    // it, which it acknowledges then (a spare that cannot store it, its
    // disk full, must never be counted on: it would be promoted with
    // nothing, and while it kept asking again the primary's pushes waited
    // for it each time).
  }
  o_.log->MoveReader(reader, next);
  o_.logger->info("backup {} follows from entry {}", id, next);
  std::atomic<bool> reading{true};
  std::thread acks([&] {
    FollowUp up;
    while (stream->Read(&up)) o_.log->Ack(id, up.applied());
    reading = false;
  });
  absl::Status end;
  while (reading && !ctx->IsCancelled()) {
    absl::StatusOr<ReplicationLog::Entry> e =
        o_.log->Next(next, absl::Milliseconds(200));
    if (!e.ok()) {
      end = e.status();
      break;
    }
    if (*e == nullptr) continue;
    // While more entries are waiting, let gRPC coalesce them into fewer
    // writes; the last one of a burst goes out at once.
    grpc::WriteOptions options;
    if (o_.log->last_index() > next + 1) options.set_buffer_hint();
    if (!stream->Write(**e, options)) break;
    o_.log->MoveReader(reader, ++next);
  }
  o_.log->RemoveReader(reader);
  ctx->TryCancel();
  acks.join();
  o_.logger->info("backup {} stopped following at entry {}: {}", id, next,
                  end.ok() ? "stream ended" : end.ToString());
  return ToGrpcStatus(end);
}

}  // namespace asyncps
