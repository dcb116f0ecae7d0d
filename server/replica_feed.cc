#include "server/replica_feed.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/fast_frame.h"
#include "common/grpc_status.h"
#include "server/write_waiter.h"

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

// One Follow call: the first message and the acknowledgements read as
// bytes on gRPC's threads. A well-formed first message starts the feed's
// thread (a stream that sends nothing holds none), which writes (waiting
// for each write) and ends the call.
class ReplicaFeedService::Stream final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // `start` starts the feed of a stream whose first message came (false:
  // no thread for it).
  Stream(grpc::CallbackServerContext* ctx, std::function<bool(Stream*)> start)
      : ctx_(ctx), start_(std::move(start)) {
    StartRead(&in_);
  }

  // The first message (set before the feed starts).
  const FollowUp& first() const { return first_; }

  // From now on every acknowledgement goes to `ack` (on gRPC's threads).
  void ReadAcks(std::function<void(uint64_t applied)> ack) {
    {
      absl::MutexLock l(&mu_);
      ack_ = std::move(ack);
    }
    StartRead(&in_);
  }

  bool reading() const {
    absl::MutexLock l(&mu_);
    return reading_;
  }
  bool cancelled() const { return ctx_->IsCancelled(); }

  // Sends `feed` and waits until it is written; false once the call is
  // gone. `more`: more follows at once (gRPC may coalesce the writes).
  bool Write(const FollowFeed& feed, bool more) {
    out_ = SerializeToByteBuffer(feed);
    grpc::WriteOptions options;
    if (more) options.set_buffer_hint();
    writes_.Started();
    StartWrite(&out_, options);
    return writes_.Wait();
  }

  // Ends the call: the feed thread's last use of the stream (it deletes
  // itself once gRPC is done with it).
  void End(const grpc::Status& status) { Finish(status); }

  void OnReadDone(bool ok) override {
    FollowUp up;
    absl::Status parsed = ok ? ParseFromByteBuffer(in_, &up)
                             : absl::UnavailableError("the stream ended");
    if (!first_read_) {
      first_read_ = true;
      if (parsed.ok() && !up.has_follow()) {
        parsed =
            absl::InvalidArgumentError("a Follow stream starts with a follow");
      }
      if (!ok) {
        parsed = absl::InvalidArgumentError(
            "the Follow stream ended before its follow");
      }
      if (!parsed.ok()) {
        Finish(ToGrpcStatus(parsed));
        return;
      }
      first_ = std::move(up);
      // Acknowledgements are read once the feed asks for them.
      if (!start_(this)) {
        Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                            absl::StrCat("this replica feeds ", kMaxFeeds,
                                         " streams already; retry later")));
      }
      return;
    }
    std::function<void(uint64_t)> ack;
    {
      absl::MutexLock l(&mu_);
      if (!parsed.ok()) {
        reading_ = false;
        return;
      }
      ack = ack_;
    }
    ack(up.applied());
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override { writes_.Done(ok); }

  void OnDone() override { delete this; }

 private:
  grpc::CallbackServerContext* const ctx_;
  const std::function<bool(Stream*)> start_;
  grpc::ByteBuffer in_;
  grpc::ByteBuffer out_;  // the feed thread's
  // Reads are one at a time: the first one's completion writes these
  // before the feed starts, and nothing after.
  bool first_read_ = false;
  FollowUp first_;
  mutable absl::Mutex mu_;
  bool reading_ ABSL_GUARDED_BY(mu_) = true;
  std::function<void(uint64_t)> ack_ ABSL_GUARDED_BY(mu_);
  WriteWaiter writes_;
};

ReplicaFeedService::ReplicaFeedService(ReplicaFeedOptions options)
    : o_(std::move(options)), feeds_(kMaxFeeds) {}

ReplicaFeedService::~ReplicaFeedService() { feeds_.Shutdown(); }

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
ReplicaFeedService::Follow(grpc::CallbackServerContext* ctx) {
  return new Stream(ctx, [this](Stream* stream) {
    return feeds_.TryRun(
        [this, stream] { stream->End(ToGrpcStatus(Serve(stream))); });
  });
}

absl::StatusOr<uint64_t> ReplicaFeedService::SendSnapshot(Stream* stream,
                                                          uint64_t reader) {
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
    if (!stream->Write(feed, /*more=*/false)) {
      return absl::UnavailableError("the backup went away during the snapshot");
    }
  } while (sent < bytes.size());
  FollowFeed end;
  end.mutable_snapshot_end()->set_index(snapshot->index);
  end.mutable_snapshot_end()->set_epoch(snapshot->epoch);
  end.mutable_snapshot_end()->set_shard_epoch(snapshot->shard_epoch);
  if (!stream->Write(end, /*more=*/false)) {
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

absl::Status ReplicaFeedService::Serve(Stream* stream) {
  const FollowRequest& f = stream->first().follow();
  if (f.run_id() != o_.run_id || f.shard_index() != o_.shard_index ||
      f.num_shards() != o_.num_shards || f.address().empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("this is shard ", o_.shard_index, "/", o_.num_shards,
                     " of run '", o_.run_id, "'; the follower asked for shard ",
                     f.shard_index(), "/", f.num_shards(), " of run '",
                     f.run_id(), "' (address '", f.address(), "')"));
  }
  if (!o_.log->primary()) {
    return absl::UnavailableError("this replica is not the primary");
  }
  const std::string id = ReplicaId(f.address(), f.incarnation());
  if (o_.admits && !o_.admits(id)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "replica ", id, " is not in shard ", o_.shard_index,
        "'s group in the shard map: it joins through the map first"));
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
      return cut.status();
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
  ReplicationLog* log = o_.log;
  stream->ReadAcks([log, id](uint64_t applied) { log->Ack(id, applied); });
  absl::Status end;
  while (stream->reading() && !stream->cancelled()) {
    absl::StatusOr<ReplicationLog::Entry> e =
        o_.log->Next(next, absl::Milliseconds(200));
    if (!e.ok()) {
      end = e.status();
      break;
    }
    if (*e == nullptr) continue;
    // While more entries are waiting, let gRPC coalesce them into fewer
    // writes; the last one of a burst goes out at once.
    if (!stream->Write(**e, /*more=*/o_.log->last_index() > next + 1)) break;
    o_.log->MoveReader(reader, ++next);
  }
  o_.log->RemoveReader(reader);
  o_.logger->info("backup {} stopped following at entry {}: {}", id, next,
                  end.ok() ? "stream ended" : end.ToString());
  return end;
}

}  // namespace asyncps
