#include "server/follower.h"

#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/net.h"
#include "server/entry_wire.h"

namespace asyncps {

namespace {

// Entries received and not yet applied: past this many bytes the stream
// reads no more until the applying thread took half of them (the primary's
// writes then wait on flow control).
constexpr size_t kMaxQueuedBytes = size_t{64} << 20;

// Replication.Follow, called through a generic stub: its messages are read
// as bytes (ReadFeedWire), so that an entry's payloads are not copied.
constexpr char kFollowMethod[] = "/asyncps.Replication/Follow";

}  // namespace

// The Follow call on gRPC's callbacks. Messages received go to a queue
// taken by Connect (the snapshot) and then by the applying thread; once
// Live, each entry is acknowledged on the thread that read it, if it
// follows on from the one before (a gap or a repeat is never
// acknowledged: the applying thread reaches it and ends the stream).
// Acknowledgements are cumulative: while one is being written, the next
// carries the latest index. A hold keeps the call from ending while the
// applying thread may still resume paused reads (Release). A message that
// does not read ends the call with that error.
class Follower::Stream final
    : public grpc::ClientBidiReactor<FollowUp, grpc::ByteBuffer> {
 public:
  // A message taken off the stream; feed is null at the end.
  struct Received {
    std::shared_ptr<FollowFeed> feed;
    std::shared_ptr<const EntryPayloads> payloads;
  };

  Stream(FollowStub* stub, grpc::ClientContext* ctx, const FollowUp& first)
      : ctx_(ctx) {
    stub->PrepareBidiStreamingCall(ctx, kFollowMethod, grpc::StubOptions(),
                                   this);
    AddHold();
    out_ = first;
    {
      absl::MutexLock l(&mu_);
      writing_ = true;
    }
    StartWrite(&out_);
    StartRead(&in_);
    StartCall();
  }

  // The first message not yet taken, waiting for it; null once the stream
  // ended with none left. Valid until Pop.
  const FollowFeed* Peek() {
    absl::MutexLock l(&mu_);
    mu_.Await(absl::Condition(this, &Stream::MessageOrEnd));
    return queue_.empty() ? nullptr : queue_.front().message.feed.get();
  }

  // Takes the first message, waiting for it; null once the stream ended
  // with none left.
  Received Pop() {
    Received m;
    bool resume = false;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(this, &Stream::MessageOrEnd));
      if (queue_.empty()) return m;
      m = std::move(queue_.front().message);
      queued_bytes_ -= queue_.front().bytes;
      queue_.pop_front();
      if (paused_ && !released_ && queued_bytes_ <= kMaxQueuedBytes / 2) {
        paused_ = false;
        resume = true;
      }
    }
    if (resume) StartRead(&in_);
    return m;
  }

  // From now on every entry received is acknowledged at once. `last`: the
  // log's last entry (after a snapshot, its cut, which the server
  // restored: acknowledged first); the entries already queued that follow
  // on from it are acknowledged too.
  void Live(uint64_t last) {
    bool write = false;
    {
      absl::MutexLock l(&mu_);
      live_ = true;
      first_ack_ = true;  // sent even when nothing followed `last`
      received_ = last;
      for (const Queued& q : queue_) {
        if (!Follows(*q.message.feed)) {
          gap_ = true;
          break;
        }
        ++received_;
      }
      write = TakeWrite();
    }
    if (write) StartWrite(&out_);
  }

  // Lets the call end (once); no read is resumed after.
  void Release() {
    {
      absl::MutexLock l(&mu_);
      if (released_) return;
      released_ = true;
    }
    RemoveHold();
  }

  // Releases the call and waits for its end: its status (a message's that
  // did not read, if one did not).
  absl::Status WaitDone() {
    Release();
    absl::MutexLock l(&mu_);
    mu_.Await(absl::Condition(&done_));
    if (!unread_.ok()) return unread_;
    return FromGrpcStatus(status_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      absl::MutexLock l(&mu_);
      read_ended_ = true;
      return;
    }
    const size_t bytes = in_.Length();
    Received m{std::make_shared<FollowFeed>(), nullptr};
    if (absl::Status s = ReadFeedWire(&in_, m.feed.get(), &m.payloads);
        !s.ok()) {
      {
        absl::MutexLock l(&mu_);
        unread_ = s;
        read_ended_ = true;
      }
      ctx_->TryCancel();
      return;
    }
    bool write = false;
    bool read = true;
    {
      absl::MutexLock l(&mu_);
      if (live_ && !gap_) {
        if (Follows(*m.feed)) {
          ++received_;
          write = TakeWrite();
        } else {
          gap_ = true;
        }
      }
      queue_.push_back(Queued{std::move(m), bytes});
      queued_bytes_ += bytes;
      if (queued_bytes_ > kMaxQueuedBytes) {
        paused_ = true;
        read = false;
      }
    }
    if (write) StartWrite(&out_);
    if (read) StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    bool write = false;
    {
      absl::MutexLock l(&mu_);
      writing_ = false;
      if (!ok) {
        write_failed_ = true;
      } else {
        write = TakeWrite();
      }
    }
    if (write) StartWrite(&out_);
  }

  void OnDone(const grpc::Status& s) override {
    absl::MutexLock l(&mu_);
    status_ = s;
    read_ended_ = true;
    done_ = true;
  }

 private:
  bool MessageOrEnd() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !queue_.empty() || read_ended_;
  }
  bool Follows(const FollowFeed& m) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return m.has_entry() && m.entry().index() == received_ + 1;
  }
  // Whether to write an acknowledgement of received_ now (out_ set).
  bool TakeWrite() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!live_ || writing_ || write_failed_ ||
        (received_ <= acked_ && !first_ack_)) {
      return false;
    }
    first_ack_ = false;
    acked_ = received_;
    out_.Clear();
    out_.set_applied(acked_);
    writing_ = true;
    return true;
  }

  struct Queued {
    Received message;
    size_t bytes;  // as received
  };

  grpc::ClientContext* const ctx_;
  grpc::ByteBuffer in_;  // the read in flight's
  absl::Mutex mu_;
  FollowUp out_;  // written under mu_ while no write is in flight
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool write_failed_ ABSL_GUARDED_BY(mu_) = false;
  bool live_ ABSL_GUARDED_BY(mu_) = false;
  bool gap_ ABSL_GUARDED_BY(mu_) = false;        // an entry did not follow on
  bool first_ack_ ABSL_GUARDED_BY(mu_) = false;  // Live: acknowledge once
  uint64_t received_ ABSL_GUARDED_BY(mu_) = 0;   // the last entry in order
  uint64_t acked_ ABSL_GUARDED_BY(mu_) = 0;      // the last acknowledged
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  size_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;  // no read in flight: full
  bool read_ended_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  absl::Status unread_ ABSL_GUARDED_BY(mu_);  // a message that did not read
};

Follower::Follower(FollowerOptions options) : o_(std::move(options)) {}

Follower::~Follower() { Stop(); }

absl::StatusOr<std::unique_ptr<Follower>> Follower::Connect(
    FollowerOptions options, absl::Duration timeout) {
  std::unique_ptr<Follower> f(new Follower(std::move(options)));
  auto channel = MakeChannel(f->o_.primary, 0, f->o_.security);
  if (!channel->WaitForConnected(absl::ToChronoTime(absl::Now() + timeout))) {
    return absl::UnavailableError(
        absl::StrCat("cannot reach the primary at ", f->o_.primary));
  }
  f->stub_ = std::make_unique<FollowStub>(channel);
  FollowUp first;
  *first.mutable_follow() = f->o_.request;
  first.mutable_follow()->set_last_index(f->o_.log->last_index());
  first.mutable_follow()->set_last_epoch(f->o_.log->last_epoch());
  f->stream_ = std::make_unique<Stream>(f->stub_.get(), &f->ctx_, first);
  const FollowFeed* head = f->stream_->Peek();
  if (head == nullptr) return f->stream_->WaitDone();
  // An entry: the primary continues after the log's last one (Loop
  // applies it first). Otherwise a snapshot comes first.
  if (head->has_entry()) return f;
  absl::Status s = f->ReadSnapshot();
  if (!s.ok()) return s;  // the destructor ends the stream
  return f;
}

absl::Status Follower::ReadSnapshot() {
  if (o_.snapshot_dir.empty()) {
    return absl::FailedPreconditionError(
        "the primary cannot continue after this replica's last entry (it "
        "needs a snapshot, which only a starting replica can load)");
  }
  FileSystem* fs = o_.fs != nullptr ? o_.fs : FileSystem::Default();
  std::shared_ptr<FollowFeed> feed = stream_->Pop().feed;  // Connect saw it
  std::string path, tmp;
  std::unique_ptr<WritableFile> out;
  // Every failure removes the partial file (it may fill the disk).
  auto fail = [&](absl::Status s) {
    out.reset();
    if (!tmp.empty()) fs->Remove(tmp).IgnoreError();
    return s;
  };
  uint64_t bytes = 0;
  while (feed->has_file()) {
    if (path.empty()) {
      const std::string& name = feed->file().name();
      if (name.empty() || name.find('/') != std::string::npos) {
        return absl::InvalidArgumentError("a snapshot file's name is bad");
      }
      path = absl::StrCat(o_.snapshot_dir, "/", name);
      tmp = path + ".part";
      absl::StatusOr<std::unique_ptr<WritableFile>> f =
          fs->NewWritableFile(tmp);
      if (!f.ok()) {
        tmp.clear();  // not made
        return f.status();
      }
      out = *std::move(f);
    }
    if (absl::Status w = out->Append(feed->file().data()); !w.ok()) {
      return fail(w);
    }
    bytes += feed->file().data().size();
    feed = stream_->Pop().feed;
    if (feed == nullptr) return fail(stream_->WaitDone());
  }
  if (!feed->has_snapshot_end() || path.empty()) {
    return fail(
        absl::DataLossError("the snapshot ended early or is malformed"));
  }
  if (absl::Status s = out->Sync(); !s.ok()) return fail(s);
  if (absl::Status s = out->Close(); !s.ok()) return fail(s);
  out.reset();
  if (absl::Status s = fs->Rename(tmp, path); !s.ok()) return fail(s);
  if (absl::Status s = fs->SyncDir(o_.snapshot_dir); !s.ok()) return s;
  o_.log->ResetTo(feed->snapshot_end().index(), feed->snapshot_end().epoch());
  shard_epoch_ = feed->snapshot_end().shard_epoch();
  o_.logger->info("received a snapshot from {} ({} bytes, at entry {})",
                  o_.primary, bytes, feed->snapshot_end().index());
  return absl::OkStatus();
}

void Follower::Start(PsService* service) {
  thread_ = std::thread([this, service] { Loop(service); });
}

void Follower::Loop(PsService* service) {
  // The snapshot's cut (the server restored it: the primary counts on this
  // replica from now, not once it sent the snapshot, which a spare may
  // have failed to store) or the log's last entry is acknowledged first.
  stream_->Live(o_.log->last_index());
  absl::Status end;
  for (;;) {
    Stream::Received got = stream_->Pop();
    if (got.feed == nullptr) break;
    if (!got.feed->has_entry()) {
      end = absl::InvalidArgumentError("the feed sent something but an entry");
      break;
    }
    // Kept by the log as received (a promoted replica feeds it on).
    got.feed->clear_file();
    got.feed->clear_snapshot_end();
    const KeptEntry fed{std::move(got.feed), std::move(got.payloads)};
    const LogEntry& e = fed.feed->entry();
    // Entries follow on (the stream acknowledged only those); one that
    // does not ends the feed, and the primary stops waiting for this
    // replica at its timeout.
    if (e.index() != o_.log->last_index() + 1) {
      end = absl::DataLossError(absl::StrCat("the feed sent entry ", e.index(),
                                             " after ", o_.log->last_index()));
      break;
    }
    absl::Status answered;
    end = o_.log->Append(
        fed, [&] { answered = service->ApplyEntry(e, fed.payloads.get()); });
    if (!end.ok()) break;
    if (!answered.ok()) {
      o_.logger->debug("entry {} answered {} (as on the primary)", e.index(),
                       answered.ToString());
    }
  }
  ctx_.TryCancel();
  const absl::Status finished = stream_->WaitDone();
  if (end.ok()) {
    end = finished.ok() ? absl::UnavailableError("the primary ended the feed")
                        : finished;
  }
  {
    absl::MutexLock l(&mu_);
    end_ = end;
  }
  o_.logger->info("stopped following {}: {}", o_.primary, end.ToString());
  ended_ = true;
}

void Follower::Stop() {
  ctx_.TryCancel();
  // The thread applies every entry received (all acknowledged) first.
  if (thread_.joinable()) thread_.join();
  if (stream_ != nullptr) stream_->WaitDone().IgnoreError();
}

absl::Status Follower::end_status() const {
  absl::MutexLock l(&mu_);
  return end_;
}

}  // namespace asyncps
