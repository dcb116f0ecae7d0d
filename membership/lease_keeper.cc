#include "membership/lease_keeper.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace asyncps {

absl::StatusOr<std::unique_ptr<LeaseKeeper>> LeaseKeeper::Start(
    LeaseKeeperOptions options) {
  if (options.etcd == nullptr || options.clock == nullptr) {
    return absl::InvalidArgumentError(
        "LeaseKeeperOptions: etcd and clock are required");
  }
  if (options.ttl < absl::Seconds(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lease TTL must be >= 1 s, got ", absl::FormatDuration(options.ttl)));
  }
  // The grant's clock starts before it is sent.
  const absl::Time sent = options.clock->Now();
  absl::StatusOr<int64_t> id = options.etcd->GrantLease(options.ttl);
  if (!id.ok()) return id.status();
  const absl::Time until = sent + absl::Floor(options.ttl, absl::Seconds(1));
  if (options.on_renewed) options.on_renewed(until);
  return std::unique_ptr<LeaseKeeper>(
      new LeaseKeeper(std::move(options), *id, until));
}

LeaseKeeper::LeaseKeeper(LeaseKeeperOptions options, int64_t id,
                         absl::Time held_until)
    : options_(std::move(options)), id_(id), held_until_(held_until) {
  thread_ = std::thread([this] { Renew(); });
}

LeaseKeeper::~LeaseKeeper() {
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
  bool lost;
  {
    absl::MutexLock l(&mu_);
    lost = lost_;
    lost_ = true;
    held_until_ = absl::InfinitePast();
  }
  if (!lost) (void)options_.etcd->RevokeLease(id_);
}

bool LeaseKeeper::Held(absl::Time now) const {
  absl::MutexLock l(&mu_);
  return !lost_ && now < held_until_;
}

absl::Time LeaseKeeper::HeldUntil() const {
  absl::MutexLock l(&mu_);
  return lost_ ? absl::InfinitePast() : held_until_;
}

void LeaseKeeper::Lose() {
  {
    absl::MutexLock l(&mu_);
    if (lost_) return;
    lost_ = true;
    held_until_ = absl::InfinitePast();
  }
  if (options_.on_lost) options_.on_lost();
}

void LeaseKeeper::Renew() {
  const absl::Duration every = options_.ttl / 3;
  // One keep-alive stream for every renewal, opened anew after one failed.
  std::unique_ptr<EtcdClient::LeaseStream> stream;
  bool failed = false;  // the last renewal failed
  for (;;) {
    // Every ttl / 3, and sooner when less is left: a grant or renewal that
    // etcd answered slowly (a restarted etcd) leaves its lease little time
    // from when it was sent, and it was lost at the next renewal, a third
    // of a TTL on. Renew at the latest half way to the expiry; after a
    // failure at once (the client has moved to another etcd member).
    const absl::Duration rest = HeldUntil() - options_.clock->Now();
    const absl::Duration wait =
        failed ? absl::Milliseconds(10)
               : std::clamp(rest / 2, absl::Milliseconds(10), every);
    if (stop_.WaitForNotificationWithTimeout(wait)) return;
    const absl::Time sent = options_.clock->Now();
    if (sent >= HeldUntil()) {  // expired before this renewal
      Lose();
      return;
    }
    if (stream == nullptr) stream = options_.etcd->OpenLeaseStream();
    // A renewal gives up with a third of the lease's rest left, so that a
    // member that stopped answering leaves time to renew on another.
    absl::StatusOr<absl::Duration> left =
        stream->Renew(id_, (HeldUntil() - sent) * 2 / 3);
    if (absl::IsNotFound(left.status())) {  // etcd says it is gone
      Lose();
      return;
    }
    failed = !left.ok();
    if (failed) {  // etcd unreachable: try again, or expire
      stream.reset();
      continue;
    }
    const absl::Time until = sent + *left;
    if (until <= HeldUntil()) continue;
    // The owner first, so that it never holds an older expiry than Held()
    // answers with (only this thread moves it).
    if (options_.on_renewed) options_.on_renewed(until);
    absl::MutexLock l(&mu_);
    if (!lost_) held_until_ = until;
  }
}

}  // namespace asyncps
