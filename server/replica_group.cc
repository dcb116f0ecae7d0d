#include "server/replica_group.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/connection_check.h"
#include "membership/member_record.h"
#include "server/group_records.h"

namespace asyncps {

using group_records::Find;
using group_records::IdOf;
using group_records::IsLive;
using group_records::Now;
using group_records::WholeStateLive;

namespace {

constexpr absl::Duration kTick = absl::Milliseconds(100);
// A caught-up backup waits this long per caught-up backup before it in map
// order before it tries to take over, so that the first one usually wins.
constexpr absl::Duration kTakeOverTurn = absl::Milliseconds(400);
// A spare is counted once it is this close to the primary's last entry.
constexpr uint64_t kCountWithin = 1024;
// A counted backup whose feed ended this long ago, with entries waiting for
// it, is probed: a connection to its address refused means its process is
// gone (a live one reconnects within a tick or two, and listens anyway).
constexpr absl::Duration kProbeAfter = absl::Milliseconds(100);
constexpr absl::Duration kProbeFor = absl::Milliseconds(50);

}  // namespace

ReplicaGroup::ReplicaGroup(ReplicaGroupOptions options)
    : o_(std::move(options)),
      log_(ReplicationLog::Options{o_.log_bytes}),
      shard_(o_.shard_index) {
  absl::BitGen bits;
  do {
    incarnation_ = absl::Uniform<uint64_t>(bits);
  } while (incarnation_ == 0);
  self_ = ReplicaId(o_.address, incarnation_);
}

ReplicaGroup::~ReplicaGroup() {
  Stop();
  // Revokes the lease: the member key goes at once, so a clean exit hands
  // over without waiting for the lease to expire.
  lease_.reset();
}

absl::StatusOr<std::unique_ptr<ReplicaGroup>> ReplicaGroup::Join(
    ReplicaGroupOptions options) {
  std::unique_ptr<ReplicaGroup> g(new ReplicaGroup(std::move(options)));
  const ReplicaGroupOptions& o = g->o_;
  const std::string endpoints = absl::StrJoin(o.etcd_endpoints, ",");
  EtcdClientOptions eo;
  eo.endpoints = o.etcd_endpoints;
  eo.access = o.etcd_access;
  eo.call_timeout = absl::Seconds(3);
  absl::StatusOr<std::unique_ptr<EtcdClient>> etcd = EtcdClient::Connect(eo);
  if (!etcd.ok()) return etcd.status();
  g->etcd_ = *std::move(etcd);
  LeaseKeeperOptions& lo = g->lease_options_;
  lo.etcd = g->etcd_.get();
  // Fenced at once (the role thread may be waiting on etcd meanwhile);
  // Rejoin decides what comes next.
  lo.on_lost = [group = g.get()] {
    group->log_.Fence(absl::UnavailableError("its lease in etcd was lost"));
  };
  // The log checks the lease at every acknowledgement too: a keeper thread
  // that runs late (a busy machine) calls on_lost late.
  lo.on_renewed = [group = g.get()](absl::Time until) {
    group->log_.HoldLeaseUntil(until);
  };
  lo.ttl = std::max(absl::Seconds(1), absl::Trunc(o.lease, absl::Seconds(1)));
  // A grant waits at most the lease's TTL; etcd starting beside this
  // process is given the call timeout.
  const absl::Time give_up = Now() + eo.call_timeout;
  absl::StatusOr<std::unique_ptr<LeaseKeeper>> lease = LeaseKeeper::Start(lo);
  while (!lease.ok() && Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(100));
    lease = LeaseKeeper::Start(lo);
  }
  if (!lease.ok() && (absl::IsUnavailable(lease.status()) ||
                      absl::IsDeadlineExceeded(lease.status()))) {
    return absl::UnavailableError(absl::StrCat(
        "cannot reach etcd at ", endpoints, " (", lease.status().message(),
        "): start etcd or fix --etcd_endpoints (or --etcd_ca, --etcd_cert, "
        "--etcd_key: etcd serving TLS, or requiring a client certificate)"));
  }
  if (!lease.ok()) {
    return absl::Status(
        lease.status().code(),
        absl::StrCat("etcd at ", endpoints,
                     " granted no lease: ", lease.status().message()));
  }
  g->lease_ = *std::move(lease);
  g->maps_ = std::make_unique<MapStore>(g->etcd_.get(), RunPrefix(o.run_id));
  g->view_ = std::make_unique<RunView>(g->etcd_.get(), RunPrefix(o.run_id));
  g->recovery_ = std::make_unique<MapRecovery>(
      g->etcd_.get(), g->maps_.get(), RunPrefix(o.run_id), g->self_, o.logger);
  ShardMapRecord initial;
  initial.set_run_id(o.run_id);
  initial.set_num_shards(o.num_shards);
  initial.set_replicas(o.replicas);
  for (int i = 0; i < o.num_shards; ++i) initial.add_groups()->set_shard(i);
  absl::StatusOr<ShardMapRecord> map = g->maps_->Initialize(initial);
  if (!map.ok()) return map.status();
  absl::Status s = g->Register();
  if (s.ok()) s = g->Decide();
  if (!s.ok()) return s;
  return g;
}

absl::Status ReplicaGroup::Register(bool standby) {
  const std::string key =
      absl::StrCat(MembersPrefix(RunPrefix(o_.run_id)), self_);
  absl::StatusOr<int64_t> put = etcd_->Put(
      key, FormatMemberValue({shard_, o_.host, standby}), lease_->id());
  return put.status();
}

absl::StatusOr<absl::flat_hash_set<std::string>> ReplicaGroup::LiveMembers() {
  const std::string prefix = MembersPrefix(RunPrefix(o_.run_id));
  absl::StatusOr<EtcdClient::Listing> listing = etcd_->List(prefix);
  if (!listing.ok()) return listing.status();
  absl::flat_hash_set<std::string> live;
  for (const EtcdKeyValue& kv : listing->kvs) {
    live.insert(kv.key.substr(prefix.size()));
  }
  return live;
}

uint64_t ReplicaGroup::shard_epoch() const {
  absl::MutexLock l(&mu_);
  return follower_ != nullptr ? follower_->snapshot_shard_epoch() : 0;
}

void ReplicaGroup::Run(PsServer* server) {
  server_ = server;
  if (claimed_) {
    log_.BecomePrimary(claimed_epoch_, {});
  } else {
    absl::MutexLock l(&mu_);
    follower_->Start(server->service());
  }
  thread_ = std::thread([this] { Loop(); });
}

void ReplicaGroup::Loop() {
  while (!stop_.WaitForNotificationWithTimeout(kTick)) Tick();
}

void ReplicaGroup::Restart(const std::string& why) {
  absl::MutexLock l(&mu_);
  if (!restart_.empty()) return;
  restart_ = why;
  o_.logger->error("replica of shard {} starts over: {}", shard_, why);
}

void ReplicaGroup::Suspend(const std::string& why) {
  if (suspended_since_ != absl::InfiniteFuture()) return;
  suspended_since_ = Now();
  log_.Fence(absl::UnavailableError(why));
  o_.logger->warn(
      "replica of shard {}: {}: it acknowledges nothing until it holds a "
      "lease and the map still gives it its role",
      shard_, why);
}

bool ReplicaGroup::HoldLease(bool* fresh) {
  *fresh = false;
  if (lease_->Held()) return true;
  absl::StatusOr<std::unique_ptr<LeaseKeeper>> lease =
      LeaseKeeper::Start(lease_options_);
  if (!lease.ok()) return false;
  lease_ = *std::move(lease);
  *fresh = true;
  return true;
}

void ReplicaGroup::Rejoin() {
  const absl::Time now = Now();
  Suspend("lost its lease in etcd (etcd unreachable?)");
  // A new lease and the same member key, once etcd answers (each tick).
  bool fresh = false;
  if (!HoldLease(&fresh) || !Register().ok()) return;
  absl::StatusOr<MapStore::Read> read = maps_->Get();
  // Etcd lost the run's map (server/map_recovery.h): the replicas put back
  // the newest one they saw, then confirm their roles in it.
  if (recovery_->Lost(read)) {
    (void)recovery_->Step(read, lease_->id());
    return;
  }
  if (!read.ok()) return;
  recovery_->Found();
  const ShardGroupRecord& group = read->map.groups(shard_);
  const int me = Find(group, self_);
  const std::string away = absl::FormatDuration(
      absl::Trunc(Now() - suspended_since_, absl::Milliseconds(1)));
  if (me < 0) {
    return Restart(absl::StrCat("its lease was lost for ", away,
                                " and the map (epoch ", read->map.epoch(),
                                ") no longer lists it; it rejoins as a spare"));
  }
  if (log_.took_primary()) {
    // Under a new epoch, so that nothing of the old one is taken for it.
    absl::StatusOr<ShardMapRecord> m =
        maps_->Update([&](ShardMapRecord* m) -> absl::StatusOr<bool> {
          const ShardGroupRecord& g = m->groups(shard_);
          if (g.replicas_size() == 0 || IdOf(g.replicas(0)) != self_) {
            return absl::AbortedError("another replica took over");
          }
          return true;
        });
    if (absl::IsAborted(m.status())) {
      return Restart(absl::StrCat("its lease was lost for ", away,
                                  " and another replica took over"));
    }
    if (!m.ok()) return;  // etcd away again: the next tick retries
    log_.Resume(m->epoch());
    {
      absl::MutexLock l(&mu_);
      map_epoch_ = m->epoch();
      group_ = m->groups(shard_);
    }
    o_.logger->warn(
        "replica of shard {} holds a lease again after {}: still its "
        "primary, now at map epoch {}, after entry {}",
        shard_, away, m->epoch(), log_.last_index());
  } else {
    if (!group.replicas(me).caught_up()) {
      return Restart(absl::StrCat("its lease was lost for ", away,
                                  " before it caught up"));
    }
    log_.Resume(0);
    o_.logger->warn(
        "replica of shard {} holds a lease again after {}: still a backup "
        "(map epoch {})",
        shard_, away, read->map.epoch());
  }
  suspended_since_ = absl::InfiniteFuture();
  resumed_at_ = now;
}

bool ReplicaGroup::must_restart(std::string* why) const {
  absl::MutexLock l(&mu_);
  *why = restart_;
  return !restart_.empty();
}

void ReplicaGroup::Tick() {
  {
    absl::MutexLock l(&mu_);
    if (!restart_.empty()) return;
  }
  // The log fences itself when the lease ran out before the keeper's
  // thread noticed (log_.lapsed()), though a renewal may still come.
  if (suspended_since_ != absl::InfiniteFuture() || !lease_->Held() ||
      log_.lapsed()) {
    return Rejoin();
  }
  // The map and the members as the watch keeps them (membership/run_view.h).
  absl::StatusOr<RunView::Snapshot> read = view_->Read();
  if (absl::IsNotFound(read.status()) || absl::IsDataLoss(read.status())) {
    Suspend(absl::StrCat("the run's shard map is lost from etcd (",
                         read.status().message(), ")"));
    return Rejoin();
  }
  if (!read.ok()) return;  // the lease bounds how long this may last
  if (read->map.epoch() < maps_->newest_epoch()) {
    // The view lags a change this process made, or etcd lost the map and a
    // server started meanwhile wrote a new run's first one: nothing to act
    // on (the replica is in no group of that one) before etcd says which.
    if (recovery_->Lost(maps_->Get())) {
      Suspend("the run's shard map in etcd is older than one it saw");
      return Rejoin();
    }
    return;
  }
  maps_->Saw(read->map);
  const absl::flat_hash_set<std::string>* live = &read->live;
  const ShardGroupRecord& group = read->map.groups(shard_);
  {
    absl::MutexLock l(&mu_);
    map_epoch_ = read->map.epoch();
    group_ = group;
  }
  const int me = Find(group, self_);
  if (me < 0) {
    log_.Fence(absl::FailedPreconditionError("dropped from the map"));
    return Restart(absl::StrCat("the map (epoch ", read->map.epoch(),
                                ") no longer lists it; it rejoins as a spare"));
  }
  if (log_.primary()) {
    if (me != 0) {
      log_.Fence(absl::FailedPreconditionError("another primary"));
      return Restart(absl::StrCat("the map (epoch ", read->map.epoch(),
                                  ") names ", group.replicas(0).address(),
                                  " the primary"));
    }
    return TendBackups(group, *live);
  }
  // Every other fence comes with a restart (above, Drop): this one is the
  // lease's (on_lost, or the log's own check), which can land while this
  // tick read the view (etcd away: the read waits for it). Restarting
  // here would throw the replica's state away, and every replica of the
  // group loses its lease at once then: the role is confirmed as after a
  // lost lease instead.
  if (log_.fenced()) return Rejoin();
  if (me == 0) {
    return Restart(
        "the map lists it first but it is no primary (its group lost every "
        "caught-up replica)");
  }
  FollowPrimary(group, *live);
}

void ReplicaGroup::TendBackups(const ShardGroupRecord& group,
                               const absl::flat_hash_set<std::string>& live) {
  absl::flat_hash_map<std::string, ReplicationLog::BackupState> states;
  for (ReplicationLog::BackupState& b : log_.Backups()) {
    states[b.address] = std::move(b);
  }
  const uint64_t last = log_.last_index();
  const absl::Time now = Now();
  // Backups the map no longer lists (a process restarted at their address
  // took their place) are not waited for.
  for (const auto& [id, state] : states) {
    if (Find(group, id) < 0) log_.StopCounting(id);
  }
  for (int i = 1; i < group.replicas_size(); ++i) {
    const ReplicaRecord& r = group.replicas(i);
    const std::string id = IdOf(r);
    // Drop logs (or fences) what fails; the next round tries again.
    if (!IsLive(live, r)) {
      // Just back from a lost lease (etcd away): its backups lost theirs
      // too and register again within a tick or two.
      if (now - resumed_at_ < 2 * o_.lease) continue;
      Drop(id, "its lease expired").IgnoreError();
      continue;
    }
    auto st = states.find(id);
    const bool known = st != states.end();
    // A counted backup (caught up, or a spare being counted) whose process
    // is gone (a live replica listens at its address): no need to wait for
    // its lease to lapse while pushes wait for it.
    if (known && st->second.counted && st->second.acked < last &&
        now - st->second.feed_ended >= kProbeAfter &&
        NothingListens(std::string(ReplicaAddress(id)), kProbeFor)) {
      Drop(id,
           "its stream ended and nothing listens at its address (its "
           "process is gone)")
          .IgnoreError();
      continue;
    }
    if (r.caught_up()) {
      if (!known || !st->second.counted) {
        log_.StartCounting(id);
      } else if (st->second.acked < last &&
                 now - st->second.last_progress > o_.replica_timeout) {
        Drop(id,
             absl::StrCat("it acknowledged nothing for ",
                          absl::FormatDuration(now - st->second.last_progress),
                          " (entry ", st->second.acked, " of ", last, ")"))
            .IgnoreError();
      }
      continue;
    }
    auto c = catching_up_.find(id);
    if (c != catching_up_.end()) {
      if (known && st->second.acked >= c->second) {
        const absl::Status marked = MarkCaughtUp(id);
        if (marked.ok()) {
          catching_up_.erase(c);
        } else {
          o_.logger->warn("cannot mark backup {} caught up: {}", id,
                          marked.ToString());
        }
      } else if (!known ||
                 now - st->second.last_progress > o_.replica_timeout) {
        // Too slow to count on yet: stop waiting for it, try again later.
        log_.StopCounting(id);
        catching_up_.erase(c);
      }
    } else if (known && st->second.acked + kCountWithin >= last) {
      catching_up_[id] = log_.StartCounting(id);
    }
  }
}

absl::Status ReplicaGroup::Drop(const std::string& address,
                                const std::string& why) {
  absl::StatusOr<ShardMapRecord> m =
      maps_->Update([&](ShardMapRecord* m) -> absl::StatusOr<bool> {
        ShardGroupRecord* g = m->mutable_groups(shard_);
        if (g->replicas_size() == 0 || IdOf(g->replicas(0)) != self_) {
          return absl::FailedPreconditionError("no longer the primary");
        }
        const int i = Find(*g, address);
        if (i < 0) return false;
        g->mutable_replicas()->erase(g->mutable_replicas()->begin() + i);
        return true;
      });
  if (absl::IsFailedPrecondition(m.status())) {
    log_.Fence(m.status());
    Restart("another replica took over as primary");
    return m.status();
  }
  if (!m.ok()) {
    if (std::optional<uint64_t> held =
            drop_lines_.Admit(m.status().ToString(), Now())) {
      o_.logger->warn("cannot drop backup {} from the map: {}{}", address,
                      m.status().ToString(), LogLimiter::HeldBack(*held));
    }
    return m.status();
  }
  drop_lines_.Reset();
  log_.StopCounting(address);
  catching_up_.erase(address);
  o_.logger->warn("dropped backup {} of shard {} (map epoch {}): {}", address,
                  shard_, m->epoch(), why);
  return absl::OkStatus();
}

absl::Status ReplicaGroup::MarkCaughtUp(const std::string& address) {
  absl::StatusOr<ShardMapRecord> m =
      maps_->Update([&](ShardMapRecord* m) -> absl::StatusOr<bool> {
        ShardGroupRecord* g = m->mutable_groups(shard_);
        if (g->replicas_size() == 0 || IdOf(g->replicas(0)) != self_) {
          return absl::FailedPreconditionError("no longer the primary");
        }
        const int i = Find(*g, address);
        if (i < 0) return absl::NotFoundError("not in the group");
        if (g->replicas(i).caught_up()) return false;
        g->mutable_replicas(i)->set_caught_up(true);
        return true;
      });
  if (m.ok()) {
    o_.logger->info("backup {} of shard {} caught up (map epoch {})", address,
                    shard_, m->epoch());
  }
  return m.status();
}

void ReplicaGroup::FollowPrimary(const ShardGroupRecord& group,
                                 const absl::flat_hash_set<std::string>& live) {
  const std::string primary = group.replicas(0).address();
  const std::string primary_id = IdOf(group.replicas(0));
  if (IsLive(live, group.replicas(0))) {
    std::unique_ptr<Follower> old;
    {
      absl::MutexLock l(&mu_);
      if (following_ == primary_id && follower_ != nullptr &&
          !follower_->ended()) {
        primary_gone_since_ = absl::InfiniteFuture();
        return;
      }
      old = std::move(follower_);
      following_.clear();
    }
    old.reset();  // stops its thread: every entry received is applied
    // Briefly: the role thread must see a dead primary's lease go.
    absl::StatusOr<std::unique_ptr<Follower>> f =
        ConnectFollower(primary, "", absl::Milliseconds(300));
    if (absl::IsFailedPrecondition(f.status())) {
      return Restart(
          absl::StrCat("primary ", primary,
                       " cannot continue its log: ", f.status().message()));
    }
    if (f.ok()) {
      primary_gone_since_ = absl::InfiniteFuture();
      (*f)->Start(server_->service());
      absl::MutexLock l(&mu_);
      follower_ = *std::move(f);
      following_ = primary_id;
      o_.logger->info("following primary {}", primary_id);
      return;
    }
    // Its key is there until its lease lapses, but a primary whose address
    // refuses connections is gone: it is taken over from now (TryPromote
    // probes again), not a lease later.
    if (!NothingListens(primary, kProbeFor)) {
      primary_gone_since_ = absl::InfiniteFuture();
      o_.logger->warn("cannot follow primary {}: {}", primary,
                      f.status().ToString());
      return;
    }
  }
  const int me = Find(group, self_);
  if (!group.replicas(me).caught_up()) {
    // A spare cannot take over: it may lack acknowledged updates. A spare
    // of any shard cannot claim the group either (it has no checkpoint of
    // it): with no caught-up replica left it starts over, and chooses a
    // group with a live primary.
    if (any_shard() && !WholeStateLive(group, live, self_)) {
      return Restart(absl::StrCat(
          "primary ", primary,
          " is gone before this spare caught up, and no caught-up replica "
          "of shard ",
          shard_, " is left"));
    }
    if (primary_gone_since_ == absl::InfiniteFuture()) {
      o_.logger->warn(
          "primary {} is gone and this spare has not caught up: waiting for "
          "another replica, or for the group to be claimed again",
          primary);
      primary_gone_since_ = Now();
    }
    return;
  }
  const absl::Time now = Now();
  // Just back from a lost lease (etcd away): the primary lost its lease
  // too and registers again within a tick or two; taking over from it
  // would only cost its pushes in flight.
  if (now - resumed_at_ < 2 * o_.lease) return;
  if (primary_gone_since_ == absl::InfiniteFuture()) primary_gone_since_ = now;
  int turn = 0;
  for (int i = 1; i < me; ++i) {
    const ReplicaRecord& r = group.replicas(i);
    turn += r.caught_up() && IsLive(live, r);
  }
  if (now - primary_gone_since_ < turn * kTakeOverTurn) return;
  TryPromote(primary_id);
}

bool ReplicaGroup::TryPromote(const std::string& dead_primary) {
  std::unique_ptr<Follower> old;
  {
    absl::MutexLock l(&mu_);
    old = std::move(follower_);
    following_.clear();
  }
  old.reset();  // every entry received is applied before taking over
  const std::string dead_key =
      absl::StrCat(MembersPrefix(RunPrefix(o_.run_id)), dead_primary);
  std::vector<std::string> counted;
  std::string how;  // how it is known to be gone
  absl::StatusOr<ShardMapRecord> m =
      maps_->Update([&](ShardMapRecord* m) -> absl::StatusOr<bool> {
        ShardGroupRecord* g = m->mutable_groups(shard_);
        if (g->replicas_size() == 0 || IdOf(g->replicas(0)) != dead_primary) {
          return absl::AbortedError("the map changed");
        }
        // Its key gone (its lease lapsed), or its process: a live primary
        // listens at its address.
        absl::StatusOr<std::optional<EtcdKeyValue>> key = etcd_->Get(dead_key);
        if (!key.ok()) return key.status();
        how = "its lease lapsed";
        if (key->has_value()) {
          if (!NothingListens(g->replicas(0).address(), kProbeFor)) {
            return absl::AbortedError("the primary is back");
          }
          how = "nothing listens at its address";
        }
        const int me = Find(*g, self_);
        if (me < 0 || !g->replicas(me).caught_up()) {
          return absl::AbortedError("not a caught-up replica");
        }
        ShardGroupRecord next;
        next.set_shard(g->shard());
        next.set_held_state(g->held_state());
        *next.add_replicas() = g->replicas(me);
        counted.clear();
        for (int i = 1; i < g->replicas_size(); ++i) {
          if (i == me) continue;
          *next.add_replicas() = g->replicas(i);
          if (g->replicas(i).caught_up()) {
            counted.push_back(IdOf(g->replicas(i)));
          }
        }
        *g = std::move(next);
        return true;
      });
  if (!m.ok()) {
    if (std::optional<uint64_t> held =
            takeover_lines_.Admit(m.status().ToString(), Now())) {
      o_.logger->info("did not take over shard {}: {}{}", shard_,
                      m.status().ToString(), LogLimiter::HeldBack(*held));
    }
    return false;
  }
  takeover_lines_.Reset();
  log_.BecomePrimary(m->epoch(), counted);
  failovers_.fetch_add(1);
  primary_gone_since_ = absl::InfiniteFuture();
  o_.logger->warn(
      "took over shard {} as its primary at map epoch {} ({} is gone: {}), "
      "after entry {}",
      shard_, m->epoch(), dead_primary, how, log_.last_index());
  return true;
}

void ReplicaGroup::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (thread_.joinable()) thread_.join();
  std::unique_ptr<Follower> f;
  {
    absl::MutexLock l(&mu_);
    f = std::move(follower_);
  }
  f.reset();
  log_.Fence(absl::UnavailableError("the process is stopping"));
}

bool ReplicaGroup::Admits(const std::string& id) {
  absl::StatusOr<MapStore::Read> read = maps_->Get();
  return read.ok() && Find(read->map.groups(shard_), id) >= 0;
}

absl::StatusOr<std::string> ReplicaGroup::PrimaryOf(int shard) {
  absl::StatusOr<MapStore::Read> read = maps_->Get();
  if (!read.ok()) return read.status();
  if (shard < 0 || shard >= read->map.groups_size() ||
      read->map.groups(shard).replicas().empty()) {
    return absl::UnavailableError(
        absl::StrCat("the run's map names no primary of shard ", shard));
  }
  return read->map.groups(shard).replicas(0).address();
}

void ReplicaGroup::FillStatus(StatusResponse* response) const {
  ReplicaStatus* r = response->mutable_replica();
  r->set_role(log_.primary() ? "primary" : log_.fenced() ? "fenced" : "backup");
  r->set_log_index(log_.last_index());
  r->set_log_epoch(log_.last_epoch());
  r->set_failovers(failovers_.load());
  const ReplicationLog::Stats stats = log_.stats();
  r->set_acked_steps(stats.acked_steps);
  r->set_ack_wait_us_total(stats.ack_wait_us_total);
  r->set_ack_wait_us_max(stats.ack_wait_us_max);
  r->set_snapshots_sent(stats.snapshots);
  r->set_snapshot_bytes_sent(stats.snapshot_bytes);
  r->set_snapshot_seconds(stats.snapshot_seconds);
  r->set_log_kept_entries(stats.kept_entries);
  r->set_log_kept_bytes(stats.kept_bytes);
  r->set_replicas(o_.replicas);
  r->set_host(o_.host);
  {
    absl::MutexLock l(&mu_);
    r->set_map_epoch(map_epoch_);
    r->set_following(following_);
  }
  ShardGroupRecord group;
  {
    absl::MutexLock l(&mu_);
    group = group_;
  }
  for (const ReplicationLog::BackupState& b : log_.Backups()) {
    ReplicaStatus::Backup* out = r->add_backups();
    out->set_address(std::string(ReplicaAddress(b.address)));
    out->set_acked(b.acked);
    out->set_counted(b.counted);
    const int i = Find(group, b.address);
    out->set_caught_up(i >= 0 && group.replicas(i).caught_up());
  }
}

}  // namespace asyncps
