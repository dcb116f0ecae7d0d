#ifndef ASYNCPS_SERVER_REPLICA_GROUP_H_
#define ASYNCPS_SERVER_REPLICA_GROUP_H_

// One server process's place in its shard group (ps_server --replicas=R
// --etcd_endpoints=...): membership in etcd, the role it takes, and the
// changes of role while it runs.
//
// Every process holds a lease and a key `<prefix>/members/<address>` under
// it (it is alive while the key exists). The run's shard map
// (membership/map_store.h) lists each group's replicas, the primary first,
// with which are caught up; it changes only by compare-and-swap, each
// change under the next epoch.
//
// Starting (Join): a process whose group has a live primary joins it as a
// spare: it is added (not caught up), follows the primary
// (server/follower.h) and receives a snapshot, which the caller restores
// as a checkpoint. While the group already lists R replicas besides it,
// it stands by (holding its lease and key, serving nothing) and joins as
// soon as one leaves the map: a replacement already running. A process whose
// group has no live replica claims the group as its primary and restores its
// own checkpoint (the loss bound of checkpoints applies only then: when every
// replica of a shard was lost).
//
// Running (the role thread, every tick):
//   primary: fences itself when its lease is not certainly held (and
//     resumes once it holds a new one and the map, unchanged, still names
//     it; see Rejoin), asks for a restart when the map names another
//     primary; drops from the map
//     (then stops waiting for) a backup whose key expired or that made no
//     progress for replica_timeout; counts a spare that caught up (waits
//     for it from then on), then marks it caught up in the map.
//   backup: follows the primary the map names; when the primary's key
//     expired, the first caught-up live backup in map order takes over
//     under a new epoch (the others wait their turn), becoming the primary
//     of the entries it applied; asks for a restart when the map no longer
//     lists it (it was dropped: it rejoins as a spare) or the primary it
//     follows cannot continue its log.
//
// Why primary-backup: one hop between the primary and each backup (a
// chain's latency grows with R), acknowledgements from all counted
// backups, and the primary's order as the log's order; see README
// "Replicated shards".
//
// Thread-safe.

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/log_limiter.h"
#include "common/security.h"
#include "common/steady_wait.h"
#include "membership/etcd_client.h"
#include "membership/lease_keeper.h"
#include "membership/map_store.h"
#include "membership/run_view.h"
#include "proto/membership.pb.h"
#include "server/follower.h"
#include "server/map_recovery.h"
#include "server/ps_server.h"
#include "server/replication_log.h"
#include "spdlog/spdlog.h"

namespace asyncps {

struct ReplicaGroupOptions {
  std::vector<std::string> etcd_endpoints;
  EtcdAccess etcd_access;  // EtcdClientOptions::access
  absl::Duration lease = absl::Seconds(1);
  std::string run_id;
  // The shard whose group the process joins; -1: whichever has a live
  // primary and fewer than R replicas (the process stands by until one
  // does, and never claims a group).
  int shard_index = 0;
  int num_shards = 1;
  int replicas = 1;     // R
  std::string host;     // placement label
  std::string address;  // host:port workers and replicas dial
  // A backup that acknowledged nothing new for this long while entries
  // waited is dropped from the map.
  absl::Duration replica_timeout = absl::Seconds(2);
  // Where a spare's snapshot is written (the checkpoint directory the
  // server restores from), through `fs` (not owned; FileSystem::Default()
  // when null).
  std::string snapshot_dir;
  FileSystem* fs = nullptr;
  // The bytes of entries the log keeps for backups that reconnect or lag
  // (ReplicationLog::Options::max_bytes).
  uint64_t log_bytes = ReplicationLog::Options().max_bytes;
  // How long Join waits for its group to have a primary or none at all
  // (not counting the time it stands by).
  absl::Duration join_timeout = absl::Seconds(60);
  // Whether this process has a checkpoint of shard `shard` to restore
  // (null: of none). In a replicated run (R >= 2) a process does not claim
  // a group that held a state (its record says held_state) without one,
  // nor with a checkpoint older than the group's last state: when the
  // group's record names the checkpoint directories of the caught-up
  // replicas it lists (checkpoint_id), a process whose directory is none of
  // theirs waits for one of them, unless the operator let it claim with
  // what it has (claim_without_checkpoint, said loudly when it does).
  // Claiming with nothing would replace the group's state with nothing (a
  // standby with an empty disk, after the group's replicas were lost at
  // once); with an older checkpoint, with what the group held when that
  // replica left it (a replica dropped or killed long before the group's
  // last one). A process of any shard claims only a group whose record
  // names its directory, with a checkpoint of that shard (it became one of
  // its replicas), and never on the operator's word. Groups of one process
  // (R = 1) are claimed as before.
  std::function<bool(int shard)> has_checkpoint;
  // This process's checkpoint directory's id (server/checkpoint_dir_id.h);
  // empty when its checkpoints do not outlive it.
  std::string checkpoint_id;
  bool claim_without_checkpoint = false;
  // Asked while Join waits (standing by, or for a takeover): true ends it
  // with CANCELLED (SIGTERM for a process that never joined). Null: never.
  std::function<bool()> stopping;
  // A process of any shard calls it with the shard it chose before it
  // joins or claims that group (its snapshot is written into
  // snapshot_dir): the lock on that shard's files there; an error ends
  // Join with it. Null: nothing to lock.
  std::function<absl::Status(int shard)> lock_shard_files;
  SecurityOptions security;
  std::shared_ptr<spdlog::logger> logger;
};

class ReplicaGroup {
 public:
  // Connects to etcd, takes the lease, registers the process, initializes
  // the map (FAILED_PRECONDITION: another run's or another shape's map at
  // the prefix) and decides the role; a spare's snapshot is in
  // snapshot_dir when this returns. UNAVAILABLE when etcd cannot be reached.
  static absl::StatusOr<std::unique_ptr<ReplicaGroup>> Join(
      ReplicaGroupOptions options);
  ~ReplicaGroup();  // Stop()
  ReplicaGroup(const ReplicaGroup&) = delete;
  ReplicaGroup& operator=(const ReplicaGroup&) = delete;

  // The server restores its own checkpoint (a claiming primary), or the
  // snapshot just received (a spare).
  bool claimed() const { return claimed_; }
  // The shard whose group it joined (the one chosen, for a process of any
  // shard).
  int shard_index() const { return shard_; }
  // The shard epoch a spare serves with (its primary's); 0 for a primary.
  uint64_t shard_epoch() const;
  ReplicationLog* log() { return &log_; }
  // The group's etcd client (the run's map record lives there too).
  EtcdClient* etcd() { return etcd_.get(); }

  // Once the server serves: the primary takes its role, a spare starts
  // applying; the role thread starts.
  void Run(PsServer* server);
  // Set when the process must start over (fenced, dropped, lease lost):
  // the reason.
  bool must_restart(std::string* why) const;
  // Ends the role thread and the feed (the lease is revoked by the
  // destructor).
  void Stop();

  // Whether replica `id` is in this shard's group in the map now (read
  // from etcd; false when etcd does not answer).
  bool Admits(const std::string& id);

  // The address of shard `shard`'s primary in the map now (read from
  // etcd): UNAVAILABLE when etcd does not answer or the group has none.
  absl::StatusOr<std::string> PrimaryOf(int shard);

  // Role, epoch and backups, for Status.
  void FillStatus(StatusResponse* response) const;

 private:
  explicit ReplicaGroup(ReplicaGroupOptions options);
  // Puts its key `<prefix>/members/<self_>` under its lease, its value
  // "shard=N host=H", with " standby" while it stands by.
  absl::Status Register(bool standby = false);
  absl::Status Decide();
  // Decide's steps: OK when decided, ABORTED to look at the map again.
  // Takes replica `id` out of the group (an earlier process at this
  // address, or this one from a group whose primary died before it could
  // follow); the group is cleared when that leaves no caught-up replica
  // after a dead primary.
  absl::Status RemoveRecord(const std::string& id);
  absl::Status JoinAsSpare(const ShardGroupRecord& group);
  // While its group (for a process of any shard: every group with a live
  // primary) lists R replicas besides this process, or (`for_state`) while
  // no replica holding its group's state is alive and it may not claim
  // the group (MayClaim): waits (its lease and key kept; the key no longer
  // says standby when it ends), then ABORTED; CANCELLED once o_.stopping
  // says so.
  absl::Status StandBy(const ShardMapRecord& map, bool for_state = false);
  bool any_shard() const { return o_.shard_index < 0; }
  // For a process of any shard: the group to join (one that lost every
  // replica holding its state while this process's directory holds it,
  // see has_checkpoint; then one that lists it already, or an earlier
  // process at its address; else the one with a live primary and the
  // fewest replicas below R, preferring one on none of its hosts), or -1.
  int ChooseShard(const ShardMapRecord& map,
                  const absl::flat_hash_set<std::string>& live) const;
  absl::Status Claim();
  // What claiming `group` would lose of the state it held.
  enum class ClaimLoss {
    kNone,        // a replicated group that never held a state, or R = 1,
                  // or this process holds the group's last state (as far
                  // as the record names it)
    kEverything,  // nothing of the shard to restore
    kSince,       // an older checkpoint than the group's last state
  };
  ClaimLoss LossOfClaim(const ShardGroupRecord& group) const;
  // Whether this process may claim `group` (see has_checkpoint).
  bool MayClaim(const ShardGroupRecord& group) const;
  // This process's entry in its group's map record.
  ReplicaRecord SelfRecord(bool caught_up) const;
  // Members alive now: address -> its key exists.
  absl::StatusOr<absl::flat_hash_set<std::string>> LiveMembers();
  void Loop();
  void Tick();
  void TendBackups(const ShardGroupRecord& group,
                   const absl::flat_hash_set<std::string>& live);
  void FollowPrimary(const ShardGroupRecord& group,
                     const absl::flat_hash_set<std::string>& live);
  // Removes `address` from the group by a map change made as its primary.
  absl::Status Drop(const std::string& address, const std::string& why);
  absl::Status MarkCaughtUp(const std::string& address);
  bool TryPromote(const std::string& dead_primary);
  absl::StatusOr<std::unique_ptr<Follower>> ConnectFollower(
      const std::string& primary, const std::string& snapshot_dir,
      absl::Duration timeout);
  void Restart(const std::string& why);
  // While its lease is lost: fenced, it takes a new lease once etcd answers,
  // registers again under the same id and, when the map still gives it its
  // role (nobody took over meanwhile), resumes it with its state; else it
  // starts over. (Starting over at once threw away every replica's state
  // when etcd itself was away: the group was claimed anew, empty.)
  void Rejoin();
  // Takes a new lease when the one held lapsed (etcd away longer than it,
  // or back without its data): false while etcd grants none; *fresh when a
  // new one was taken (the member key must be put again).
  bool HoldLease(bool* fresh);
  // Fences the log for `why` and makes the next ticks Rejoin (once).
  void Suspend(const std::string& why);

  const ReplicaGroupOptions o_;
  std::unique_ptr<EtcdClient> etcd_;
  std::unique_ptr<LeaseKeeper> lease_;
  LeaseKeeperOptions lease_options_;
  std::unique_ptr<MapStore> maps_;
  std::unique_ptr<RunView> view_;          // read by the role thread's ticks
  std::unique_ptr<MapRecovery> recovery_;  // the role thread's
  ReplicationLog log_;
  // The shard whose group it is in: o_.shard_index, or as Decide chose
  // (-1 until then). Fixed once Join returns.
  int shard_ = 0;
  uint64_t incarnation_ = 0;  // this process at o_.address; nonzero
  std::string self_;          // ReplicaId(o_.address, incarnation_)
  // How long a spare waits before it asks its primary again after a try
  // that failed on its side (doubling up to 5 s: each try costs the primary
  // a whole snapshot).
  absl::Duration spare_retry_ = absl::Milliseconds(200);
  bool claimed_ = false;
  uint64_t claimed_epoch_ = 0;
  PsServer* server_ = nullptr;

  mutable absl::Mutex mu_;
  std::unique_ptr<Follower> follower_ ABSL_GUARDED_BY(mu_);
  std::string following_ ABSL_GUARDED_BY(mu_);  // the primary's ReplicaId
  uint64_t map_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  ShardGroupRecord group_ ABSL_GUARDED_BY(mu_);  // as last read
  std::string restart_ ABSL_GUARDED_BY(mu_);
  // Spares being counted: the index each must acknowledge before the map
  // calls it caught up.
  absl::flat_hash_map<std::string, uint64_t> catching_up_;
  // When this backup first saw its primary gone.
  absl::Time primary_gone_since_ = absl::InfiniteFuture();
  // Role thread only: since when it is suspended (Suspend: its lease lost
  // or its map gone; InfiniteFuture: not), and when it last resumed its
  // role after that (backups whose keys are not back yet are given a
  // lease's time to register again).
  absl::Time suspended_since_ = absl::InfiniteFuture();
  absl::Time resumed_at_ = absl::InfinitePast();
  std::atomic<uint64_t> failovers_{0};
  // The role thread's failed map changes, tried again every tick while
  // they fail (etcd refusing writes: its database full): one line per
  // reason per 10 s.
  LogLimiter takeover_lines_{absl::Seconds(10)};
  LogLimiter drop_lines_{absl::Seconds(10)};

  SteadyNotification stop_;  // the role thread ends
  std::thread thread_;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_REPLICA_GROUP_H_
