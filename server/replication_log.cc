#include "server/replication_log.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"

namespace asyncps {
ReplicationLog::ReplicationLog(Options options) : options_(options) {}

void ReplicationLog::BecomePrimary(uint64_t epoch,
                                   const std::vector<std::string>& counted) {
  absl::MutexLock l(&mu_);
  primary_ = true;
  epoch_ = epoch;
  for (const std::string& address : counted) {
    BackupState& b = backups_[address];
    b.address = address;
    b.counted = true;
    b.last_progress = options_.clock->Now();
  }
  NoteFollowers();
}

bool ReplicationLog::primary() const {
  absl::MutexLock l(&mu_);
  return primary_ && fenced_.ok();
}

absl::StatusOr<uint64_t> ReplicationLog::RunEntry(
    LogEntry* given, absl::FunctionRef<MadeEntry()> make,
    absl::FunctionRef<void(LogEntry*)> apply) {
  std::shared_ptr<FollowFeed> feed;
  std::shared_ptr<const EntryPayloads> payloads;
  const auto made = [&] {
    feed = std::make_shared<FollowFeed>();
    if (given != nullptr) {
      *feed->mutable_entry() = std::move(*given);
      return;
    }
    MadeEntry m = make();
    *feed->mutable_entry() = std::move(m.entry);
    payloads = std::move(m.payloads);
  };
  if (followed_.load(std::memory_order_acquire)) made();
  uint64_t index = 0;
  {
    absl::MutexLock l(&mu_);
    if (!fenced_.ok()) return fenced_;
    if (Unleased()) return Refusal(Unleasing());  // fenced at the next answer
    if (!primary_) {
      return absl::UnavailableError(
          "this replica is a backup: requests go to the shard's primary");
    }
    if (feed == nullptr && Followed()) made();
    LogEntry scratch;
    apply(feed != nullptr    ? feed->mutable_entry()
          : given != nullptr ? given
                             : &scratch);
    index = ++last_index_;
    last_epoch_ = epoch_;
    // A backup that held every entry had nothing to acknowledge until now:
    // its silence counts from this entry, not from its last answer (else
    // the first entry after an idle spell looked like seconds of silence,
    // and a backup was dropped if the role thread looked before it
    // answered).
    std::optional<absl::Time> now;  // read once, if a backup needs it
    for (auto& [address, b] : backups_) {
      if (b.acked + 1 != index) continue;
      if (!now.has_value()) now = options_.clock->Now();
      b.last_progress = *now;
    }
    if (feed != nullptr) {
      feed->mutable_entry()->set_index(index);
      feed->mutable_entry()->set_epoch(epoch_);
      KeptEntry kept{std::move(feed), std::move(payloads)};
      const uint64_t bytes = KeptBytes(kept);
      Keep(std::move(kept), bytes);
    } else {
      // Nobody may ever ask for this entry or those before it.
      kept_.clear();
      kept_bytes_ = 0;
      first_kept_ = index + 1;
    }
  }
  NotifyAppended();
  return index;
}

void ReplicationLog::SetAppendListener(std::function<void()> appended) {
  absl::MutexLock l(&listener_mu_);
  listener_ =
      appended
          ? std::make_shared<const std::function<void()>>(std::move(appended))
          : nullptr;
}

void ReplicationLog::NotifyAppended() {
  std::shared_ptr<const std::function<void()>> listener;
  {
    absl::MutexLock l(&listener_mu_);
    listener = listener_;
  }
  if (listener != nullptr) (*listener)();
}

void ReplicationLog::AtCut(
    absl::FunctionRef<void(uint64_t index, uint64_t epoch)> cut) {
  absl::MutexLock l(&mu_);
  cut(last_index_, last_epoch_);
}

absl::Status ReplicationLog::Append(KeptEntry fed,
                                    absl::FunctionRef<void()> apply) {
  const LogEntry& entry = fed.feed->entry();
  const uint64_t bytes = KeptBytes(fed);
  absl::MutexLock l(&mu_);
  if (primary_) {
    return absl::FailedPreconditionError("the primary appends through Run");
  }
  if (entry.index() != last_index_ + 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("entry ", entry.index(), " does not follow entry ",
                     last_index_, " (the feed skipped or repeated one)"));
  }
  apply();
  last_index_ = entry.index();
  last_epoch_ = entry.epoch();
  Keep(std::move(fed), bytes);
  return absl::OkStatus();
}

void ReplicationLog::ResetTo(uint64_t index, uint64_t epoch) {
  absl::MutexLock l(&mu_);
  kept_.clear();
  kept_bytes_ = 0;
  last_index_ = index;
  last_epoch_ = epoch;
  first_kept_ = index + 1;
}

void ReplicationLog::Keep(KeptEntry entry, uint64_t bytes) {
  kept_.emplace_back(std::move(entry), bytes);
  kept_bytes_ += bytes;
  uint64_t needed = std::numeric_limits<uint64_t>::max();
  for (const auto& [id, at] : readers_) needed = std::min(needed, at + 1);
  const uint64_t unsent_bound =
      std::max(options_.max_unsent_bytes, 4 * options_.max_bytes);
  while (kept_bytes_ > options_.max_bytes && kept_.size() > 1 &&
         (first_kept_ < needed || kept_bytes_ > unsent_bound)) {
    kept_bytes_ -= kept_.front().second;
    kept_.pop_front();
    ++first_kept_;
  }
}

uint64_t ReplicationLog::MinCountedAck() const {
  uint64_t min = std::numeric_limits<uint64_t>::max();
  for (const auto& [address, b] : backups_) {
    if (b.counted) min = std::min(min, b.acked);
  }
  return min;
}

std::vector<ReplicationLog::Waiter> ReplicationLog::TakeReady() {
  std::vector<Waiter> ready;
  const uint64_t acked = MinCountedAck();
  const absl::Time now = options_.clock->Now();
  while (!waiters_.empty() && waiters_.begin()->first <= acked) {
    auto it = waiters_.begin();
    const uint64_t us = absl::ToInt64Microseconds(now - it->second.since);
    ++stats_.acked_steps;
    stats_.ack_wait_us_total += us;
    stats_.ack_wait_us_max = std::max(stats_.ack_wait_us_max, us);
    ready.push_back(std::move(it->second));
    waiters_.erase(it);
  }
  return ready;
}

ReplicationLog::Stats ReplicationLog::stats() const {
  absl::MutexLock l(&mu_);
  Stats s = stats_;
  s.kept_entries = kept_.size();
  s.kept_bytes = kept_bytes_;
  return s;
}

void ReplicationLog::NoteSnapshot(uint64_t bytes, absl::Duration took) {
  absl::MutexLock l(&mu_);
  ++stats_.snapshots;
  stats_.snapshot_bytes += bytes;
  stats_.snapshot_seconds += absl::ToDoubleSeconds(took);
}

void ReplicationLog::Complete(std::vector<Waiter> ready,
                              const absl::Status& s) {
  for (Waiter& w : ready) w.done(s);
}

void ReplicationLog::WhenAcked(uint64_t index,
                               std::function<void(absl::Status)> done) {
  absl::Status status;
  std::vector<Waiter> lapsed;
  bool fenced_now = false;
  {
    absl::MutexLock l(&mu_);
    fenced_now = FenceIfUnleased(&lapsed);
    if (fenced_.ok() && MinCountedAck() < index) {
      waiters_.emplace(index,
                       Waiter{index, std::move(done), options_.clock->Now()});
      return;
    }
    if (fenced_.ok()) ++stats_.acked_steps;
    status = fenced_;
  }
  Complete(std::move(lapsed), status);
  done(status);
  if (fenced_now) NotifyAppended();  // feeds end
}

void ReplicationLog::Ack(const std::string& address, uint64_t applied) {
  std::vector<Waiter> ready;
  absl::Status status;
  bool fenced_now = false;
  {
    absl::MutexLock l(&mu_);
    BackupState& b = backups_[address];
    b.address = address;
    NoteFollowers();
    if (applied > b.acked) {
      b.acked = applied;
      b.last_progress = options_.clock->Now();
    }
    b.feed_ended = absl::InfiniteFuture();
    fenced_now = FenceIfUnleased(&ready);
    if (fenced_.ok()) ready = TakeReady();
    status = fenced_;
  }
  Complete(std::move(ready), status);
  if (fenced_now) NotifyAppended();
}

void ReplicationLog::FeedStarted(const std::string& address) {
  absl::MutexLock l(&mu_);
  auto b = backups_.find(address);
  if (b != backups_.end()) b->second.feed_ended = absl::InfiniteFuture();
}

void ReplicationLog::FeedEnded(const std::string& address) {
  absl::MutexLock l(&mu_);
  auto b = backups_.find(address);
  if (b != backups_.end()) b->second.feed_ended = options_.clock->Now();
}

uint64_t ReplicationLog::StartCounting(const std::string& address) {
  absl::MutexLock l(&mu_);
  BackupState& b = backups_[address];
  b.address = address;
  NoteFollowers();
  if (!b.counted) b.last_progress = options_.clock->Now();
  b.counted = true;
  return last_index_;
}

void ReplicationLog::StopCounting(const std::string& address) {
  std::vector<Waiter> ready;
  absl::Status status;
  bool fenced_now = false;
  {
    absl::MutexLock l(&mu_);
    backups_.erase(address);
    NoteFollowers();
    fenced_now = FenceIfUnleased(&ready);
    if (fenced_.ok()) ready = TakeReady();
    status = fenced_;
  }
  Complete(std::move(ready), status);
  if (fenced_now) NotifyAppended();
}

absl::Status ReplicationLog::Refusal(const absl::Status& why) {
  return absl::UnavailableError(absl::StrCat(
      "this replica no longer acknowledges requests: ", why.message()));
}

std::vector<ReplicationLog::Waiter> ReplicationLog::FenceLocked(
    const absl::Status& why) {
  std::vector<Waiter> all;
  if (!fenced_.ok()) return all;
  fenced_ = Refusal(why);
  for (auto& [index, w] : waiters_) all.push_back(std::move(w));
  waiters_.clear();
  return all;
}

bool ReplicationLog::Unleased() const {
  return options_.clock->Now() >= lease_until_;
}

absl::Status ReplicationLog::Unleasing() const {
  return absl::UnavailableError(absl::StrCat(
      "its lease in etcd is not certainly held (it ran out ",
      absl::ToInt64Milliseconds(options_.clock->Now() - lease_until_),
      " ms ago)"));
}

bool ReplicationLog::FenceIfUnleased(std::vector<Waiter>* waiters) {
  if (!fenced_.ok() || !Unleased()) return false;
  *waiters = FenceLocked(Unleasing());
  lapsed_ = true;
  return true;
}

bool ReplicationLog::lapsed() const {
  absl::MutexLock l(&mu_);
  return lapsed_;
}

void ReplicationLog::HoldLeaseUntil(absl::Time until) {
  absl::MutexLock l(&mu_);
  lease_until_ = until;
}

void ReplicationLog::Fence(const absl::Status& why) {
  std::vector<Waiter> all;
  absl::Status status;
  {
    absl::MutexLock l(&mu_);
    if (!fenced_.ok()) return;
    all = FenceLocked(why);
    status = fenced_;
  }
  Complete(std::move(all), status);
  NotifyAppended();  // feeds end
}

void ReplicationLog::Resume(uint64_t epoch) {
  absl::MutexLock l(&mu_);
  fenced_ = absl::OkStatus();
  lapsed_ = false;
  if (primary_) epoch_ = epoch;
  const absl::Time now = options_.clock->Now();
  for (auto& [address, b] : backups_) b.last_progress = now;
}

bool ReplicationLog::took_primary() const {
  absl::MutexLock l(&mu_);
  return primary_;
}

bool ReplicationLog::fenced() const {
  absl::MutexLock l(&mu_);
  return !fenced_.ok();
}

bool ReplicationLog::CanContinue(uint64_t index, uint64_t epoch) const {
  absl::MutexLock l(&mu_);
  if (index == 0 || index > last_index_) return false;
  if (index == last_index_) return epoch == last_epoch_;
  if (index + 1 < first_kept_) return false;
  // The entry after it must be held; the backup's last entry must be the
  // same one (same epoch) as this log's.
  if (index >= first_kept_) {
    return kept_[index - first_kept_].first.feed->entry().epoch() == epoch;
  }
  // index == first_kept_ - 1: its epoch is no longer known here.
  return false;
}

absl::StatusOr<KeptEntry> ReplicationLog::Next(uint64_t index,
                                               absl::Duration wait) {
  absl::MutexLock l(&mu_);
  auto ready = [this, index]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !fenced_.ok() || last_index_ > index;
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), wait);
  if (!fenced_.ok()) return fenced_;
  if (last_index_ <= index) return KeptEntry();
  if (index + 1 < first_kept_) {
    return absl::OutOfRangeError(absl::StrCat(
        "entry ", index + 1, " is no longer kept (oldest ", first_kept_, ")"));
  }
  return kept_[index + 1 - first_kept_].first;
}

uint64_t ReplicationLog::AddReader(uint64_t index) {
  absl::MutexLock l(&mu_);
  readers_[next_reader_] = index;
  NoteFollowers();
  return next_reader_++;
}

void ReplicationLog::MoveReader(uint64_t reader, uint64_t index) {
  absl::MutexLock l(&mu_);
  readers_[reader] = index;
}

void ReplicationLog::RemoveReader(uint64_t reader) {
  absl::MutexLock l(&mu_);
  readers_.erase(reader);
  NoteFollowers();
}

std::vector<ReplicationLog::BackupState> ReplicationLog::Backups() const {
  absl::MutexLock l(&mu_);
  std::vector<BackupState> out;
  for (const auto& [address, b] : backups_) out.push_back(b);
  std::sort(out.begin(), out.end(),
            [](const BackupState& a, const BackupState& b) {
              return a.address < b.address;
            });
  return out;
}

uint64_t ReplicationLog::last_index() const {
  absl::MutexLock l(&mu_);
  return last_index_;
}

uint64_t ReplicationLog::last_epoch() const {
  absl::MutexLock l(&mu_);
  return last_epoch_;
}

}  // namespace asyncps
