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

// One Follow call. The first message and the acknowledgements are read as
// bytes on gRPC's threads. A well-formed first message starts the feed's
// thread (a stream that sends nothing holds none), which sends a snapshot
// when one is needed, waiting for each write, then makes the stream live:
// from then on Pump writes the next entry whenever the write before it is
// done and the log holds one, on the thread that appended it or that
// completed the write before. The stream owns itself (self_) until gRPC is
// done with it; the live set holds it too, so a pump never touches a
// deleted stream (only an ended one, which writes nothing).
class ReplicaFeedService::Stream final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // `start` starts the feed of a stream whose first message came (false:
  // no room for it); `ended` runs once a started stream ends.
  static Stream* Open(std::function<bool(std::shared_ptr<Stream>)> start,
                      std::function<void(Stream*)> ended) {
    std::shared_ptr<Stream> stream(
        new Stream(std::move(start), std::move(ended)));
    stream->self_ = stream;
    stream->StartRead(&stream->in_);
    return stream.get();
  }

  // The first message (set before the feed starts).
  const FollowUp& first() const { return first_; }

  // Before Live: sends `feed` and waits until it is written; false once
  // the call is gone.
  bool Write(const FollowFeed& feed) {
    out_ = SerializeToByteBuffer(feed);
    writes_.Started();
    StartWrite(&out_);
    return writes_.Wait();
  }

  // From now on acknowledgements go to `log` as `id`'s, and the entries
  // after `next` are written as they come (`reader` keeps them in the log
  // until then). No write may be in flight.
  void Live(ReplicationLog* log, uint64_t reader, uint64_t next, std::string id,
            std::shared_ptr<spdlog::logger> logger) {
    log_ = log;
    reader_ = reader;
    id_ = std::move(id);
    logger_ = std::move(logger);
    {
      absl::MutexLock l(&mu_);
      next_ = next;
      live_ = true;
    }
    log_->FeedStarted(id_);
    StartRead(&in_);
    Pump();
  }

  // Writes the next entry unless a write is in flight (its completion
  // pumps again) or there is none yet (its append pumps). Ends the call
  // when the log cannot go on (fenced, or the entry is no longer kept).
  // No write carries gRPC's buffer hint: a hinted write completes only
  // once a later write flushes it, and the next write waits for that
  // completion (with the hint on bursts, a backup that reconnected while
  // entries came got none: its primary dropped it 2 s later).
  void Pump() {
    absl::Status failed;
    {
      absl::MutexLock l(&mu_);
      if (!live_ || ended_ || writing_) return;
      absl::StatusOr<KeptEntry> e = log_->Next(next_, absl::ZeroDuration());
      if (!e.ok()) {
        failed = e.status();
      } else if (e->feed == nullptr) {
        return;
      } else {
        writing_ = true;
        out_ = EntryWire(*e);
      }
    }
    if (!failed.ok()) return End(ToGrpcStatus(failed));
    StartWrite(&out_);
  }

  // Ends the call (once; after the write in flight, if any).
  void End(const grpc::Status& status) {
    {
      absl::MutexLock l(&mu_);
      if (ended_) return;
      ended_ = true;
      end_ = status;
      if (writing_) return;  // Written finishes it
    }
    FinishNow(status);
  }

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
      // Acknowledgements are read once the stream is live.
      if (!start_(self_)) {
        Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                            absl::StrCat("this replica feeds ", kMaxFeeds,
                                         " streams already; retry later")));
      }
      return;
    }
    // The backup ended its side (or sent garbage): the feed ends.
    if (!parsed.ok()) return End(grpc::Status::OK);
    log_->Ack(id_, up.applied());
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock l(&mu_);
      if (!live_) {
        writes_.Done(ok);
        return;
      }
    }
    Written(ok);
  }

  void OnCancel() override {
    // Before Live the feed's thread sees its writes fail.
    bool live;
    {
      absl::MutexLock l(&mu_);
      live = live_;
    }
    if (live) End(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    std::shared_ptr<Stream> me = std::move(self_);  // freed with the last
  }

 private:
  Stream(std::function<bool(std::shared_ptr<Stream>)> start,
         std::function<void(Stream*)> ended)
      : start_(std::move(start)), ended_callback_(std::move(ended)) {}

  // A live write's completion.
  void Written(bool ok) {
    bool ended = false;
    grpc::Status finish;
    {
      absl::MutexLock l(&mu_);
      writing_ = false;
      if (ok) {
        log_->MoveReader(reader_, ++next_);
      } else if (!ended_) {
        ended_ = true;
        end_ =
            grpc::Status(grpc::StatusCode::UNAVAILABLE, "the backup went away");
      }
      ended = ended_;
      finish = end_;
    }
    if (!ended) return Pump();
    FinishNow(finish);
  }

  void FinishNow(const grpc::Status& status) {
    uint64_t next = 0;
    bool live = false;
    {
      absl::MutexLock l(&mu_);
      if (finished_) return;
      finished_ = true;
      live = live_;
      next = next_;
    }
    if (live) {
      log_->RemoveReader(reader_);
      log_->FeedEnded(id_);
      logger_->info("backup {} stopped following at entry {}: {}", id_, next,
                    status.ok() ? "stream ended" : status.error_message());
    }
    ended_callback_(this);
    Finish(status);
  }

  const std::function<bool(std::shared_ptr<Stream>)> start_;
  const std::function<void(Stream*)> ended_callback_;
  std::shared_ptr<Stream> self_;  // until OnDone
  grpc::ByteBuffer in_;
  // Reads are one at a time: the first one's completion writes these
  // before the feed starts, and nothing after.
  bool first_read_ = false;
  FollowUp first_;
  // Set by Live before the first acknowledgement is read; read-only after.
  ReplicationLog* log_ = nullptr;
  uint64_t reader_ = 0;
  std::string id_;
  std::shared_ptr<spdlog::logger> logger_;
  WriteWaiter writes_;  // the writes before Live
  mutable absl::Mutex mu_;
  // Written by the feed's thread before Live, by whoever set writing_
  // after.
  grpc::ByteBuffer out_;
  bool live_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;  // a live write in flight
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status end_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 0;  // the last entry written
};

void ReplicaFeedService::Live::Pump() {
  std::vector<std::shared_ptr<Stream>> live;
  {
    absl::MutexLock l(&mu);
    if (streams.empty()) return;
    live = streams;
  }
  for (const std::shared_ptr<Stream>& s : live) s->Pump();
}

ReplicaFeedService::ReplicaFeedService(ReplicaFeedOptions options)
    : o_(std::move(options)),
      live_(std::make_shared<Live>()),
      feeds_(kMaxFeeds) {
  std::shared_ptr<Live> live = live_;
  o_.log->SetAppendListener([live] { live->Pump(); });
}

ReplicaFeedService::~ReplicaFeedService() {
  o_.log->SetAppendListener(nullptr);
  feeds_.Shutdown();
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
ReplicaFeedService::Follow(grpc::CallbackServerContext* /*ctx*/) {
  std::shared_ptr<Live> live = live_;
  auto start = [this, live](std::shared_ptr<Stream> stream) {
    {
      absl::MutexLock l(&live->mu);
      if (live->open >= kMaxFeeds) return false;
      ++live->open;
    }
    if (feeds_.TryRun([this, stream] {
          absl::Status s = Serve(stream);
          if (!s.ok()) stream->End(ToGrpcStatus(s));
        })) {
      return true;
    }
    absl::MutexLock l(&live->mu);
    --live->open;
    return false;
  };
  auto ended = [live](Stream* stream) {
    absl::MutexLock l(&live->mu);
    --live->open;
    auto& v = live->streams;
    v.erase(std::remove_if(v.begin(), v.end(),
                           [stream](const std::shared_ptr<Stream>& s) {
                             return s.get() == stream;
                           }),
            v.end());
  };
  return Stream::Open(std::move(start), std::move(ended));
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

absl::Status ReplicaFeedService::Serve(const std::shared_ptr<Stream>& stream) {
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
    absl::StatusOr<uint64_t> cut = SendSnapshot(stream.get(), reader);
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
  {
    absl::MutexLock l(&live_->mu);
    live_->streams.push_back(stream);
  }
  stream->Live(o_.log, reader, next, id, o_.logger);
  return absl::OkStatus();
}

}  // namespace asyncps
