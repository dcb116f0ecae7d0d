#ifndef ASYNCPS_MEMBERSHIP_LEASE_KEEPER_H_
#define ASYNCPS_MEMBERSHIP_LEASE_KEEPER_H_

// A process's lease in etcd, renewed in the background, and the one answer
// every write path of a replicated shard asks before it acknowledges
// anything: "do I still hold my lease?".
//
// The answer is conservative. A renewal's clock starts when its request is
// sent, not when etcd answers, so the keeper's idea of the expiry is never
// later than etcd's: once Held() turns false, etcd may already have given
// the lease's keys (a primary's role) to somebody else, and from then on
// the process must acknowledge nothing it did under that lease. A lost
// lease is never renewed again: the process must be given a new one (and a
// new role) through the map.
//
// Its time is the monotonic clock's (Clock::Monotonic), and so are its
// waits (common/steady_wait.h), as etcd's own lease expiry is: a step of
// the real-time clock (an operator's `date -s`, NTP) neither lets a lapsed
// lease look held (a step back) nor loses a held one (a step forward), and
// the renewals go on through it.
//
// Example:
//
//   LeaseKeeperOptions o;
//   o.etcd = etcd.get();
//   o.ttl = absl::Seconds(2);
//   o.on_lost = [&] { stop_acknowledging(); };
//   absl::StatusOr<std::unique_ptr<LeaseKeeper>> lease =
//       LeaseKeeper::Start(o);
//   if (!lease.ok()) return lease.status();       // etcd unreachable
//   etcd->Put("/asyncps/run1/servers/host-a", "10.0.0.5:7000",
//             (*lease)->id());                    // gone with the lease
//   ...
//   if (!(*lease)->Held()) return absl::UnavailableError("lease lost");
//
// Thread-safe.

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/steady_wait.h"
#include "membership/etcd_client.h"

namespace asyncps {

struct LeaseKeeperOptions {
  EtcdClient* etcd = nullptr;  // not owned; outlives the keeper
  // The lease's time to live (whole seconds, >= 1). Renewals are sent
  // every ttl / 3 (sooner when less than two of those are left); one gives
  // up with a third of the lease's rest left, and the next goes at once,
  // to the next etcd member (EtcdClientOptions::endpoints), so a member
  // that stops answering costs no lease. They share one keep-alive stream
  // (EtcdClient::LeaseStream), opened anew after a renewal failed.
  absl::Duration ttl = absl::Seconds(2);
  // Runs once, on the keeper's thread, when the lease is lost (expired
  // unrenewed, or etcd answered that it is gone).
  std::function<void()> on_lost;
  // Runs with HeldUntil() after the grant (in Start, before it returns)
  // and after every renewal that moved it (on the keeper's thread): for a
  // write path that checks the lease itself at each acknowledgement
  // (ReplicationLog::HoldLeaseUntil), not only when on_lost came.
  std::function<void(absl::Time)> on_renewed;
  // Monotonic: Held(now) and HeldUntil() are on this clock.
  Clock* clock = Clock::Monotonic();  // not owned
};

class LeaseKeeper {
 public:
  // Grants the lease and starts renewing it. Errors of the grant (etcd
  // unreachable within its call timeout) come back here.
  static absl::StatusOr<std::unique_ptr<LeaseKeeper>> Start(
      LeaseKeeperOptions options);

  // Stops renewing and revokes the lease (best effort: an unreachable etcd
  // lets it expire by itself).
  ~LeaseKeeper();
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  int64_t id() const { return id_; }
  // True while the lease is certainly still held at `now`.
  bool Held(absl::Time now) const;
  bool Held() const { return Held(options_.clock->Now()); }
  // When the lease is certainly held until (InfinitePast once lost).
  absl::Time HeldUntil() const;

 private:
  LeaseKeeper(LeaseKeeperOptions options, int64_t id, absl::Time held_until);
  void Renew();  // the renewal thread
  // Marks the lease lost (once) and tells the owner.
  void Lose();

  // Const after construction.
  const LeaseKeeperOptions options_;
  const int64_t id_;

  mutable absl::Mutex mu_;
  absl::Time held_until_ ABSL_GUARDED_BY(mu_);
  bool lost_ ABSL_GUARDED_BY(mu_) = false;

  SteadyNotification stop_;
  std::thread thread_;  // last: started once everything else is set
};

}  // namespace asyncps

#endif  // ASYNCPS_MEMBERSHIP_LEASE_KEEPER_H_
