#ifndef ASYNCPS_SERVER_REPLICATION_LOG_H_
#define ASYNCPS_SERVER_REPLICATION_LOG_H_

// The ordered log of one replica of a shard group (ps_server --replicas).
//
// On the primary every request that may change the shard's state runs
// through Run: the request is applied and appended as the next entry under
// one lock, so the log's order is the order the primary applied them in.
// Backups (server/follower.h) read entries from it over the Follow stream
// (server/replica_feed.h) and acknowledge them by index; WhenAcked calls
// back once every *counted* backup (the caught-up replicas of the group's
// current map) acknowledged an index: only then is a worker answered. A
// backup leaves the counted set only through a map change in etcd
// (server/replica_role.h), so an acknowledged request is held by every
// replica that may ever be promoted.
//
// On a backup the log keeps the entries it applied (Append), with their
// primary's indices and epochs, so that once promoted it can feed the other
// backups from where they are.
//
// Fence() ends the primary's role for good (its lease is lost, or a newer
// map names another primary): Run refuses, and every waiter fails with
// UNAVAILABLE, so a fenced primary acknowledges nothing more; the workers
// retry at the new primary, where de-duplication answers what was applied.
//
// Example (the primary's push path):
//
//   absl::StatusOr<uint64_t> index = log->Run(std::move(entry), [&] {
//     status = service->DoPush(...);
//   });
//   if (!index.ok()) return answer(index.status());
//   log->WhenAcked(*index, [=](absl::Status s) { answer(s.ok() ? status : s);
//   });
//
// Thread-safe.

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "proto/replication.pb.h"
#include "server/entry_wire.h"

namespace asyncps {

// What a step's `make` gives the log: the entry, and its payloads when
// they are kept outside it (null: the entry holds them).
struct MadeEntry {
  MadeEntry(LogEntry e) : entry(std::move(e)) {}  // NOLINT: implicit
  MadeEntry(LogEntry e, std::shared_ptr<const EntryPayloads> p)
      : entry(std::move(e)), payloads(std::move(p)) {}
  LogEntry entry;
  std::shared_ptr<const EntryPayloads> payloads;
};

class ReplicationLog {
 public:
  struct Options {
    // Entries kept for backups that reconnect or lag (oldest dropped
    // first); a backup that needs a dropped entry starts over with a
    // snapshot.
    uint64_t max_bytes = uint64_t{64} << 20;
    // Entries a connected feed has yet to send are kept beyond max_bytes,
    // up to this or 4x max_bytes, whichever is more: a spare receiving its
    // snapshot while training goes on needs every entry since the cut.
    uint64_t max_unsent_bytes = uint64_t{1} << 30;
    // Monotonic, as the lease's (HoldLeaseUntil) and the role's times.
    Clock* clock = Clock::Monotonic();  // not owned
  };
  explicit ReplicationLog(Options options);
  ReplicationLog(const ReplicationLog&) = delete;
  ReplicationLog& operator=(const ReplicationLog&) = delete;

  // From now on this replica is the primary: Run appends entries of
  // `epoch` after the last one. `counted`: the caught-up backups of the map
  // that made it primary.
  void BecomePrimary(uint64_t epoch, const std::vector<std::string>& counted);
  bool primary() const;

  // The primary's step: runs `apply`, then appends the entry `make` built
  // with the next index and this primary's epoch, both under the log's
  // lock. UNAVAILABLE (and nothing run) when this replica is not (or no
  // longer) the primary. `apply` may add to the entry (what it evicted)
  // before it is appended.
  //
  // A primary that nobody follows (no backup, no feed: a group of one
  // process) keeps no entry and makes none: a spare that comes later
  // starts from a snapshot cut after it. `make` then does not run, and
  // `apply` gets a scratch entry. It runs outside the lock, or under it
  // when a follower came meanwhile.
  absl::StatusOr<uint64_t> Run(absl::FunctionRef<MadeEntry()> make,
                               absl::FunctionRef<void(LogEntry*)> apply) {
    return RunEntry(nullptr, make, apply);
  }
  // The same for an entry made already, which `apply` gets either way.
  absl::StatusOr<uint64_t> Run(LogEntry entry,
                               absl::FunctionRef<void(LogEntry*)> apply) {
    return RunEntry(
        &entry, [] { return MadeEntry(LogEntry()); }, apply);
  }
  absl::StatusOr<uint64_t> Run(LogEntry entry,
                               absl::FunctionRef<void()> apply) {
    return Run(std::move(entry), [&](LogEntry*) { apply(); });
  }
  // Calls `appended` after every entry Run appends and after Fence, on
  // that thread and outside the log's lock: a feed writes the entry from
  // there (server/replica_feed.h) instead of waking a thread of its own.
  // Null: none.
  void SetAppendListener(std::function<void()> appended);

  // Runs `cut` under the lock with the last entry's index and epoch: no
  // entry is run meanwhile (a snapshot's consistent cut).
  void AtCut(absl::FunctionRef<void(uint64_t index, uint64_t epoch)> cut);

  // A backup's step: runs `apply` and appends the entry as its primary
  // numbered it (indices must follow on), under the lock, so that AtCut
  // sees the state of a whole number of entries. `fed` is the entry as
  // received (ReadFeedWire): no copy of its payloads.
  absl::Status Append(KeptEntry fed, absl::FunctionRef<void()> apply);
  // A backup starting from a snapshot taken after entry (index, epoch).
  void ResetTo(uint64_t index, uint64_t epoch);

  // Calls done(OK) once every counted backup acknowledged `index` (at once
  // when none is counted), or done(UNAVAILABLE) when the log is fenced
  // first. `done` runs on the caller's thread or an acknowledging one and
  // must not block.
  void WhenAcked(uint64_t index, std::function<void(absl::Status)> done);

  // Backups' acknowledgements, by their map address.
  void Ack(const std::string& address, uint64_t applied);
  // Counts `address` from now on (WhenAcked waits for it); returns the
  // last index, which it must acknowledge before the map may call it
  // caught up.
  uint64_t StartCounting(const std::string& address);
  // Stops counting `address` (the map dropped it): waiters blocked only by
  // it complete.
  void StopCounting(const std::string& address);

  // Ends the primary's role (a backup's: stops its appends) until Resume.
  void Fence(const absl::Status& why);
  // The lease that gives this replica its role is certainly held until
  // `until` (options.clock; LeaseKeeperOptions::on_renewed), and no
  // further: from then on Run refuses and the first acknowledgement due
  // (WhenAcked, Ack, StopCounting) fences the log as Fence does, whether or
  // not the lease keeper has noticed yet and called Fence itself (its
  // thread may run late on a busy machine). No bound until the first call.
  void HoldLeaseUntil(absl::Time until);
  // Whether the log fenced itself so, since the last Resume (the lease may
  // have been renewed after all: the role must be confirmed, as after a
  // lost lease).
  bool lapsed() const;
  bool fenced() const;
  // Lifts the fence of a replica whose role the map confirmed after it
  // lost its lease (etcd was away, nobody took over): a primary goes on
  // under `epoch` (the map's, one on), with the backups it counted; what
  // waited when it was fenced was answered UNAVAILABLE (clients retry).
  void Resume(uint64_t epoch);
  // Whether this replica took the primary's role (fenced or not).
  bool took_primary() const;

  // The entry after `index` for a backup's feed: waits up to `wait` for it
  // (null when none came); OUT_OF_RANGE when the log no longer holds it
  // (or never held entries of that epoch: a diverged backup), UNAVAILABLE
  // once fenced.
  absl::StatusOr<KeptEntry> Next(uint64_t index, absl::Duration wait);
  // A feed's position (the last entry it sent): entries after it are kept
  // (see Options.max_bytes) until RemoveReader.
  uint64_t AddReader(uint64_t index);
  void MoveReader(uint64_t reader, uint64_t index);
  void RemoveReader(uint64_t reader);
  // Whether a backup whose last entry is (index, epoch) can continue from
  // this log (else it needs a snapshot).
  bool CanContinue(uint64_t index, uint64_t epoch) const;

  struct BackupState {
    std::string address;
    uint64_t acked = 0;
    bool counted = false;
    absl::Time last_progress;  // when its acknowledged index last moved
    // When its feed ended, while no other has started or acknowledged
    // since (InfiniteFuture: following, as far as the log knows).
    absl::Time feed_ended = absl::InfiniteFuture();
  };
  // A backup's feed started or ended (server/replica_feed.h); a backup the
  // log does not track (dropped, or a spare yet to acknowledge) is left
  // untracked.
  void FeedStarted(const std::string& address);
  void FeedEnded(const std::string& address);
  std::vector<BackupState> Backups() const;

  // What replication cost so far.
  struct Stats {
    // Answers that waited for the backups, and how long (from the step's
    // entry to the last counted backup's acknowledgement).
    uint64_t acked_steps = 0;
    uint64_t ack_wait_us_total = 0;
    uint64_t ack_wait_us_max = 0;
    // Snapshots sent to spares (catch-up), their bytes and seconds.
    uint64_t snapshots = 0;
    uint64_t snapshot_bytes = 0;
    double snapshot_seconds = 0;
    // The entries kept now (for backups that reconnect or lag) and their
    // bytes, as received or made.
    uint64_t kept_entries = 0;
    uint64_t kept_bytes = 0;
  };
  Stats stats() const;
  void NoteSnapshot(uint64_t bytes, absl::Duration took);
  uint64_t last_index() const;
  uint64_t last_epoch() const;

 private:
  struct Waiter {
    uint64_t index;
    std::function<void(absl::Status)> done;
    absl::Time since;
  };
  // Run's body: the entry is *given, or make()'s when `given` is null.
  absl::StatusOr<uint64_t> RunEntry(LogEntry* given,
                                    absl::FunctionRef<MadeEntry()> make,
                                    absl::FunctionRef<void(LogEntry*)> apply);
  // Takes the waiters whose index every counted backup acknowledged.
  std::vector<Waiter> TakeReady() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The error a fenced log answers: UNAVAILABLE, saying why.
  static absl::Status Refusal(const absl::Status& why);
  // Fences the log with `why` (unless it is already); returns the waiters
  // to complete with fenced_ outside the lock.
  std::vector<Waiter> FenceLocked(const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the lease ran out (HoldLeaseUntil), and a status that says so.
  bool Unleased() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Unleasing() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fences the log once Unleased() (true then, with the waiters to
  // complete in *waiters).
  bool FenceIfUnleased(std::vector<Waiter>* waiters)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t MinCountedAck() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a backup or a feed may read entries still to come; kept in
  // followed_ for Run's look before it takes the lock.
  bool Followed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !backups_.empty() || !readers_.empty();
  }
  void NoteFollowers() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    followed_.store(Followed(), std::memory_order_release);
  }
  void Keep(KeptEntry entry, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Complete(std::vector<Waiter> ready, const absl::Status& s);
  void NotifyAppended() ABSL_LOCKS_EXCLUDED(mu_, listener_mu_);

  const Options options_;
  mutable absl::Mutex mu_;
  bool primary_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status fenced_ ABSL_GUARDED_BY(mu_);
  absl::Time lease_until_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool lapsed_ ABSL_GUARDED_BY(mu_) = false;  // fenced by FenceIfUnleased
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_index_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // Entries kept: kept_[i] has index first_kept_ + i.
  std::deque<std::pair<KeptEntry, uint64_t>> kept_ ABSL_GUARDED_BY(mu_);
  uint64_t first_kept_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t kept_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, BackupState> backups_ ABSL_GUARDED_BY(mu_);
  // By index; several may wait for one index.
  std::multimap<uint64_t, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, uint64_t> readers_ ABSL_GUARDED_BY(mu_);
  uint64_t next_reader_ ABSL_GUARDED_BY(mu_) = 1;
  std::atomic<bool> followed_{false};
  // Copied under its own lock, called outside both.
  absl::Mutex listener_mu_;
  std::shared_ptr<const std::function<void()>> listener_
      ABSL_GUARDED_BY(listener_mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_REPLICATION_LOG_H_
