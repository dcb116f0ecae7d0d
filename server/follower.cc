#include "server/follower.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/net.h"

namespace asyncps {

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
  f->stub_ = Replication::NewStub(channel);
  f->stream_ = f->stub_->Follow(&f->ctx_);
  FollowUp first;
  *first.mutable_follow() = f->o_.request;
  first.mutable_follow()->set_last_index(f->o_.log->last_index());
  first.mutable_follow()->set_last_epoch(f->o_.log->last_epoch());
  FollowFeed feed;
  if (!f->stream_->Write(first) || !f->stream_->Read(&feed)) {
    f->finished_ = true;
    return FromGrpcStatus(f->stream_->Finish());
  }
  if (feed.has_entry()) {
    // Continues after the log's last entry: Loop applies this one first.
    f->pending_ = std::make_unique<FollowFeed>(std::move(feed));
    return f;
  }
  absl::Status s = f->ReadSnapshot(feed);
  if (!s.ok()) return s;  // the destructor ends the stream
  return f;
}

absl::Status Follower::ReadSnapshot(const FollowFeed& first) {
  if (o_.snapshot_dir.empty()) {
    return absl::FailedPreconditionError(
        "the primary cannot continue after this replica's last entry (it "
        "needs a snapshot, which only a starting replica can load)");
  }
  FileSystem* fs = o_.fs != nullptr ? o_.fs : FileSystem::Default();
  FollowFeed feed = first;
  std::string path, tmp;
  std::unique_ptr<WritableFile> out;
  // Every failure removes the partial file (it may fill the disk).
  auto fail = [&](absl::Status s) {
    out.reset();
    if (!tmp.empty()) fs->Remove(tmp).IgnoreError();
    return s;
  };
  uint64_t bytes = 0;
  while (feed.has_file()) {
    if (path.empty()) {
      const std::string& name = feed.file().name();
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
    if (absl::Status w = out->Append(feed.file().data()); !w.ok()) {
      return fail(w);
    }
    bytes += feed.file().data().size();
    if (!stream_->Read(&feed)) {
      finished_ = true;
      return fail(FromGrpcStatus(stream_->Finish()));
    }
  }
  if (!feed.has_snapshot_end() || path.empty()) {
    return fail(
        absl::DataLossError("the snapshot ended early or is malformed"));
  }
  if (absl::Status s = out->Sync(); !s.ok()) return fail(s);
  if (absl::Status s = out->Close(); !s.ok()) return fail(s);
  out.reset();
  if (absl::Status s = fs->Rename(tmp, path); !s.ok()) return fail(s);
  if (absl::Status s = fs->SyncDir(o_.snapshot_dir); !s.ok()) return s;
  o_.log->ResetTo(feed.snapshot_end().index(), feed.snapshot_end().epoch());
  shard_epoch_ = feed.snapshot_end().shard_epoch();
  snapshot_ = true;
  snapshot_index_ = feed.snapshot_end().index();
  o_.logger->info("received a snapshot from {} ({} bytes, at entry {})",
                  o_.primary, bytes, feed.snapshot_end().index());
  return absl::OkStatus();
}

void Follower::Start(PsService* service) {
  thread_ = std::thread([this, service] { Loop(service); });
}

void Follower::Loop(PsService* service) {
  absl::Status end;
  auto apply = [&](const FollowFeed& feed) {
    if (!feed.has_entry()) {
      return absl::InvalidArgumentError("the feed sent something but an entry");
    }
    const LogEntry& e = feed.entry();
    // Acknowledged once received, before it is applied: the primary's
    // answer does not wait for this replica's apply, which overlaps the
    // primary's next steps. Held all the same: this thread applies it
    // before anything else (Stop, and so a promotion, waits for it), and a
    // replica that dies loses its applied state as much as this entry.
    // Entries follow on (checked by Append); one that does not ends the
    // feed, and the primary stops waiting for this replica at its timeout.
    if (e.index() != o_.log->last_index() + 1) {
      return absl::DataLossError(absl::StrCat("the feed sent entry ", e.index(),
                                              " after ", o_.log->last_index()));
    }
    FollowUp up;
    up.set_applied(e.index());
    stream_->Write(up);
    absl::Status answered;
    absl::Status s =
        o_.log->Append(e, [&] { answered = service->ApplyEntry(e); });
    if (!s.ok()) return s;
    if (!answered.ok()) {
      o_.logger->debug("entry {} answered {} (as on the primary)", e.index(),
                       answered.ToString());
    }
    return absl::OkStatus();
  };
  if (snapshot_) {
    // The server restored the snapshot: it holds the state up to the cut.
    FollowUp up;
    up.set_applied(snapshot_index_);
    if (!stream_->Write(up)) end = absl::UnavailableError("the feed ended");
  }
  if (end.ok() && pending_ != nullptr) end = apply(*pending_);
  pending_.reset();
  FollowFeed feed;
  while (end.ok() && stream_->Read(&feed)) end = apply(feed);
  ctx_.TryCancel();
  const absl::Status finished = FromGrpcStatus(stream_->Finish());
  finished_ = true;
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
  if (thread_.joinable()) {
    thread_.join();
  } else if (stream_ != nullptr && !finished_) {
    stream_->Finish();
  }
  finished_ = true;
}

absl::Status Follower::end_status() const {
  absl::MutexLock l(&mu_);
  return end_;
}

}  // namespace asyncps
