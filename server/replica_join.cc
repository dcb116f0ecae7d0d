// How a starting server process takes its place in its shard group
// (ReplicaGroup::Join's decision, server/replica_group.h): forget its
// earlier self, join as a spare, stand by, or claim the group.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/group_records.h"
#include "server/replica_group.h"

namespace asyncps {

using group_records::Find;
using group_records::IdOf;
using group_records::IsLive;
using group_records::NamedHolders;
using group_records::NamesCheckpoint;
using group_records::Now;
using group_records::OthersIn;
using group_records::WholeStateLive;

// Decide's outcomes of one look at the map: done (OK), look again
// (ABORTED), or fail.
absl::Status ReplicaGroup::RemoveRecord(const std::string& id) {
  absl::StatusOr<ShardMapRecord> m =
      maps_->Update([&](ShardMapRecord* m) -> absl::StatusOr<bool> {
        auto* rs = m->mutable_groups(shard_)->mutable_replicas();
        const int i = Find(m->groups(shard_), id);
        if (i < 0) return false;
        rs->erase(rs->begin() + i);
        // A dead primary without a caught-up backup: the spares left hold
        // no whole state and must not be first; the group is claimed anew.
        bool caught_up = false;
        for (const ReplicaRecord& r : *rs)
          caught_up = caught_up || r.caught_up();
        if (i == 0 && !caught_up) rs->Clear();
        return true;
      });
  return m.ok() ? absl::AbortedError("look again") : m.status();
}

absl::Status ReplicaGroup::JoinAsSpare(const ShardGroupRecord& group) {
  const std::string primary = group.replicas(0).address();
  const std::string primary_id = IdOf(group.replicas(0));
  for (const ReplicaRecord& r : group.replicas()) {
    // Its own record (a join that is being retried) is no other replica.
    if (r.host() == o_.host && r.address() != o_.address) {
      o_.logger->warn(
          "replica {} of shard {} runs on host '{}' too: one host's loss "
          "takes both (give each replica its own --host_label when there are "
          "enough hosts)",
          r.address(), shard_, o_.host);
    }
  }
  absl::StatusOr<ShardMapRecord> m =
      maps_->Update([&](ShardMapRecord* m) -> absl::StatusOr<bool> {
        ShardGroupRecord* g = m->mutable_groups(shard_);
        if (g->replicas_size() == 0 || IdOf(g->replicas(0)) != primary_id) {
          return absl::AbortedError("the primary changed");
        }
        // Added by an earlier attempt whose connection failed: follow now.
        if (Find(*g, self_) >= 0) return false;
        // Another process took the place that was free.
        if (OthersIn(*g, self_) >= o_.replicas) {
          return absl::AbortedError("the group has its replicas");
        }
        *g->add_replicas() = SelfRecord(/*caught_up=*/false);
        return true;
      });
  if (!m.ok()) return m.status();
  absl::StatusOr<std::unique_ptr<Follower>> f =
      ConnectFollower(primary, o_.snapshot_dir, absl::Seconds(5));
  if (!f.ok()) {
    // The primary unreachable: look again soon (it may have changed). A
    // failure on this side (its disk full: the status says so) would come
    // again at once, and each try costs the primary a whole snapshot.
    constexpr absl::Duration kFirst = absl::Milliseconds(200);
    spare_retry_ = absl::IsUnavailable(f.status())
                       ? kFirst
                       : std::min(2 * spare_retry_, absl::Seconds(5));
    o_.logger->warn("cannot follow primary {} yet: {} (again in {})", primary,
                    f.status().ToString(), absl::FormatDuration(spare_retry_));
    absl::SleepFor(spare_retry_);
    return absl::AbortedError("look again");
  }
  spare_retry_ = absl::Milliseconds(200);
  absl::MutexLock l(&mu_);
  follower_ = *std::move(f);
  following_ = primary_id;
  map_epoch_ = m->epoch();
  o_.logger->info("joined shard {} as a spare of primary {} (map epoch {})",
                  shard_, primary, m->epoch());
  return absl::OkStatus();
}

ReplicaRecord ReplicaGroup::SelfRecord(bool caught_up) const {
  ReplicaRecord r;
  r.set_address(o_.address);
  r.set_host(o_.host);
  r.set_incarnation(incarnation_);
  r.set_caught_up(caught_up);
  r.set_checkpoint_id(o_.checkpoint_id);
  return r;
}

ReplicaGroup::ClaimLoss ReplicaGroup::LossOfClaim(
    const ShardGroupRecord& group) const {
  if (o_.replicas < 2 || !group.held_state()) return ClaimLoss::kNone;
  if (!o_.has_checkpoint || !o_.has_checkpoint(shard_)) {
    return ClaimLoss::kEverything;
  }
  if (!NamedHolders(group).empty() &&
      !NamesCheckpoint(group, o_.checkpoint_id)) {
    return ClaimLoss::kSince;
  }
  return ClaimLoss::kNone;
}

bool ReplicaGroup::MayClaim(const ShardGroupRecord& group) const {
  // A spare of any shard has a checkpoint of a group only as one of its
  // replicas: of the group's last state, or of none worth claiming with.
  if (any_shard()) {
    return NamesCheckpoint(group, o_.checkpoint_id) &&
           LossOfClaim(group) == ClaimLoss::kNone;
  }
  return LossOfClaim(group) == ClaimLoss::kNone || o_.claim_without_checkpoint;
}

absl::Status ReplicaGroup::Claim() {
  ClaimLoss loss = ClaimLoss::kNone;  // said below
  std::vector<std::string> holders;   // of the state it loses
  absl::StatusOr<ShardMapRecord> m =
      maps_->Update([&](ShardMapRecord* m) -> absl::StatusOr<bool> {
        ShardGroupRecord* g = m->mutable_groups(shard_);
        absl::StatusOr<absl::flat_hash_set<std::string>> now = LiveMembers();
        if (!now.ok()) return now.status();
        // A spare that has not caught up (alive, it waits for the group
        // to be claimed) is no reason not to: it rejoins as a spare.
        if (WholeStateLive(*g, *now, self_)) {
          return absl::AbortedError("a replica came back");
        }
        if (!MayClaim(*g)) {
          return absl::AbortedError("no checkpoint of the group's state");
        }
        loss = LossOfClaim(*g);
        holders = NamedHolders(*g);
        g->clear_replicas();
        g->set_held_state(true);
        *g->add_replicas() = SelfRecord(/*caught_up=*/true);
        return true;
      });
  if (!m.ok()) return m.status();
  claimed_ = true;
  claimed_epoch_ = m->epoch();
  absl::MutexLock l(&mu_);
  map_epoch_ = m->epoch();
  if (loss == ClaimLoss::kEverything) {
    o_.logger->warn(
        "claimed shard {} as its primary (map epoch {}) with nothing to "
        "restore (--claim_without_checkpoint): the state the group held is "
        "lost and the shard starts anew",
        shard_, m->epoch());
    return absl::OkStatus();
  }
  if (loss == ClaimLoss::kSince) {
    o_.logger->warn(
        "claimed shard {} as its primary (map epoch {}) with its own "
        "checkpoint (--claim_without_checkpoint), older than the group's "
        "last state, which {} held: what the group applied since this "
        "process's checkpoint is lost",
        shard_, m->epoch(), absl::StrJoin(holders, ", "));
    return absl::OkStatus();
  }
  o_.logger->info(
      "claimed shard {} as its primary (map epoch {}): no other replica is "
      "alive; its own checkpoint is the group's state",
      shard_, m->epoch());
  return absl::OkStatus();
}

int ReplicaGroup::ChooseShard(
    const ShardMapRecord& map,
    const absl::flat_hash_set<std::string>& live) const {
  int best = -1, best_others = 0;
  bool best_shares_host = false;
  for (int i = 0; i < map.groups_size(); ++i) {
    const ShardGroupRecord& g = map.groups(i);
    // Added by a join that then failed to reach the primary: that group
    // again (its record there would otherwise hold a place for nobody).
    if (Find(g, self_) >= 0) return i;
    // A group that lost every replica holding its state, which this
    // process's directory holds (it was one of them): claimed back.
    if (!WholeStateLive(g, live, self_) &&
        NamesCheckpoint(g, o_.checkpoint_id) && o_.has_checkpoint &&
        o_.has_checkpoint(i)) {
      return i;
    }
    bool shares_host = false;
    for (const ReplicaRecord& r : g.replicas()) {
      // An earlier process at this address: that group first (it leaves
      // the map there before this one joins anything).
      if (r.address() == o_.address && IdOf(r) != self_) return i;
      shares_host = shares_host || r.host() == o_.host;
    }
    const int others = OthersIn(g, self_);
    if (g.replicas_size() == 0 || !IsLive(live, g.replicas(0)) ||
        others >= o_.replicas) {
      continue;
    }
    // The group with the fewest replicas, then one on no host of ours.
    if (best < 0 || others < best_others ||
        (others == best_others && best_shares_host && !shares_host)) {
      best = i;
      best_others = others;
      best_shares_host = shares_host;
    }
  }
  return best;
}

absl::Status ReplicaGroup::StandBy(const ShardMapRecord& map, bool for_state) {
  // Its key says it stands by (psctl status) before its line does.
  bool registered = Register(/*standby=*/true).ok();
  if (for_state && LossOfClaim(map.groups(shard_)) == ClaimLoss::kSince) {
    o_.logger->warn(
        "shard {} held a state and no replica holding it is alive; its last "
        "state is in the checkpoints of {}, and this process's checkpoint is "
        "older: it waits for one of them to claim the group "
        "(--claim_without_checkpoint lets it claim with its own, losing what "
        "the group applied since)",
        shard_, absl::StrJoin(NamedHolders(map.groups(shard_)), ", "));
  } else if (for_state) {
    o_.logger->warn(
        "shard {} held a state and no replica holding it is alive; this "
        "process has no checkpoint of it to restore and waits for a process "
        "that has one (--claim_without_checkpoint lets it start the shard "
        "anew, its state lost)",
        shard_);
  } else if (any_shard()) {
    o_.logger->info(
        "every shard group has its {} replicas (or no live primary): this "
        "process stands by and joins one when a replica leaves",
        o_.replicas);
  } else {
    std::vector<std::string> listed;
    for (const ReplicaRecord& r : map.groups(shard_).replicas()) {
      listed.push_back(r.address());
    }
    o_.logger->info(
        "shard {} has its {} replicas ({}): this process stands by and joins "
        "it when one leaves",
        shard_, o_.replicas, absl::StrJoin(listed, ", "));
  }
  while (true) {
    if (o_.stopping && o_.stopping()) {
      return absl::CancelledError("stopped while standing by");
    }
    absl::SleepFor(absl::Milliseconds(200));
    // Its key must stay while it waits (etcd away longer than its lease, or
    // back without its data): a new lease, the same key.
    bool fresh = false;
    if (!HoldLease(&fresh)) continue;
    if (fresh || !registered) registered = Register(/*standby=*/true).ok();
    if (!registered) continue;
    // The watched view, not two reads of etcd per look: a standby may wait
    // for as long as the run lasts.
    absl::StatusOr<RunView::Snapshot> now = view_->Read();
    // etcd away, or the map not back yet (or another shape's, for now).
    if (!now.ok() || now->map.groups_size() != o_.num_shards) continue;
    bool place = false;  // a group it may join now
    if (any_shard()) {
      place = ChooseShard(now->map, now->live) >= 0;
    } else if (for_state) {
      // Claimed by a process that had the state (or a replica came back).
      place = WholeStateLive(now->map.groups(shard_), now->live, self_);
    } else {
      const ShardGroupRecord& g = now->map.groups(shard_);
      place = OthersIn(g, self_) < o_.replicas || g.replicas_size() == 0 ||
              !now->live.contains(IdOf(g.replicas(0)));
    }
    if (place) {
      (void)Register();  // a standby no more
      return absl::AbortedError("look again");
    }
  }
}

absl::Status ReplicaGroup::Decide() {
  absl::Time deadline = Now() + o_.join_timeout;
  while (Now() < deadline) {
    if (o_.stopping && o_.stopping()) {
      return absl::CancelledError("stopped before it joined its group");
    }
    absl::StatusOr<MapStore::Read> read = maps_->Get();
    if (!read.ok()) return read.status();
    absl::StatusOr<absl::flat_hash_set<std::string>> live = LiveMembers();
    if (!live.ok()) return live.status();
    absl::Status s = absl::AbortedError("look again");
    if (any_shard()) {
      // Chosen again at every look: never a group without a live primary
      // (a spare of any shard holds no state to claim one with), unless
      // its directory holds the state of one that lost every replica
      // holding it.
      shard_ = ChooseShard(read->map, *live);
      if (shard_ < 0) {
        s = StandBy(read->map);
        deadline = Now() + o_.join_timeout;  // it waited for a place
        if (!absl::IsAborted(s)) return s;
        continue;
      }
      if (o_.lock_shard_files) {
        if (absl::Status locked = o_.lock_shard_files(shard_); !locked.ok()) {
          return locked;
        }
      }
    }
    const ShardGroupRecord& group = read->map.groups(shard_);
    // Its own record, added by a join whose primary then died, is none of
    // the others: counted, it would wait for itself to take over.
    const bool whole_live = WholeStateLive(group, *live, self_);
    int earlier = -1;  // an earlier process at this address
    for (int i = 0; i < group.replicas_size(); ++i) {
      const ReplicaRecord& r = group.replicas(i);
      if (r.address() == o_.address && IdOf(r) != self_) earlier = i;
    }
    const bool may_claim = MayClaim(group);
    // In a group that lost every replica holding its state, a process of
    // the shard claims it or waits, its earlier record kept: the record
    // names the checkpoints of the group's last state (a claim clears it).
    if (earlier >= 0 && (whole_live || (any_shard() && !may_claim))) {
      // It holds nothing now; once its lease lapsed (and, if it was the
      // primary, unless a backup is taking over) it leaves the map.
      const ReplicaRecord& r = group.replicas(earlier);
      if (!IsLive(*live, r) && !(earlier == 0 && whole_live)) {
        s = RemoveRecord(IdOf(r));
      } else {
        absl::SleepFor(absl::Milliseconds(200));
      }
    } else if (group.replicas_size() > 0 && IsLive(*live, group.replicas(0))) {
      if (OthersIn(group, self_) < o_.replicas) {
        s = JoinAsSpare(group);
      } else {
        s = StandBy(read->map);
        deadline = Now() + o_.join_timeout;  // it waited for a place
      }
    } else if (!whole_live && may_claim) {
      // No replica holds the group's whole state: its checkpoint is it.
      s = Claim();
    } else if (!whole_live && !any_shard() && Find(group, self_) >= 0) {
      // Added as a spare by a join whose primary then died: it waits for
      // the state holding no place in the group (psctl lists it waiting).
      s = RemoveRecord(self_);
    } else if (!whole_live && !any_shard()) {
      s = StandBy(read->map, /*for_state=*/true);
      deadline = Now() + o_.join_timeout;  // it waited for a state holder
    } else if (!whole_live && Find(group, self_) >= 0) {
      // A spare of any shard holds none of it to claim the group with: out
      // of it (its record would keep the group from being claimed), and
      // it chooses again.
      s = RemoveRecord(self_);
      if (absl::IsAborted(s)) {
        o_.logger->warn(
            "left shard {}'s group: its primary {} is gone and no caught-up "
            "replica is left (a process of that shard claims it)",
            shard_, group.replicas(0).address());
      }
    } else {
      // Replicas are alive but the primary is not: a backup is taking over.
      absl::SleepFor(absl::Milliseconds(200));
    }
    if (!absl::IsAborted(s)) return s;
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "shard ", shard_, " has live replicas but no live primary after ",
      absl::FormatDuration(o_.join_timeout)));
}

absl::StatusOr<std::unique_ptr<Follower>> ReplicaGroup::ConnectFollower(
    const std::string& primary, const std::string& snapshot_dir,
    absl::Duration timeout) {
  FollowerOptions fo;
  fo.primary = primary;
  fo.request.set_run_id(o_.run_id);
  fo.request.set_shard_index(shard_);
  fo.request.set_num_shards(o_.num_shards);
  fo.request.set_address(o_.address);
  fo.request.set_incarnation(incarnation_);
  fo.snapshot_dir = snapshot_dir;
  fo.log = &log_;
  fo.security = o_.security;
  fo.fs = o_.fs;
  fo.logger = o_.logger;
  return Follower::Connect(std::move(fo), timeout);
}

}  // namespace asyncps
