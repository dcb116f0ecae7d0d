#include "server/shard_stats.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace asyncps {

namespace {
constexpr auto kRelaxed = std::memory_order_relaxed;
}  // namespace

ShardStats::ShardStats() : last_time_(absl::Now()) {
  for (auto& b : buckets_) b.store(0, kRelaxed);
}

uint64_t ShardStats::BucketUpperBound(int i) {
  if (i < kExactBuckets) return static_cast<uint64_t>(i) + 1;
  if (i == kBuckets - 1) {
    return static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  }
  return uint64_t{1} << (i - kExactBuckets + 5);  // 32, 64, ..., 2^16
}

int ShardStats::BucketOf(uint64_t staleness) {
  for (int i = 0; i < kBuckets - 1; ++i) {
    if (staleness < BucketUpperBound(i)) return i;
  }
  return kBuckets - 1;
}

void ShardStats::RecordPull(uint64_t bytes_out) {
  pulls_.fetch_add(1, kRelaxed);
  bytes_out_.fetch_add(bytes_out, kRelaxed);
}

void ShardStats::RecordPullWait() { pull_waits_.fetch_add(1, kRelaxed); }

void ShardStats::RecordPullWaitTimeout() {
  pull_wait_timeouts_.fetch_add(1, kRelaxed);
}

void ShardStats::RecordPush(uint64_t bytes_in, bool duplicate) {
  pushes_.fetch_add(1, kRelaxed);
  bytes_in_.fetch_add(bytes_in, kRelaxed);
  if (duplicate) duplicate_pushes_.fetch_add(1, kRelaxed);
}

void ShardStats::RecordBadInput() { rejected_bad_input_.fetch_add(1, kRelaxed); }

void ShardStats::RecordSliceResult(const SliceResult& r) {
  if (r.outcome() == APPLIED) {
    updates_applied_.fetch_add(1, kRelaxed);
    if (r.lr_scale() < 1.0f) scaled_.fetch_add(1, kRelaxed);
  } else {
    refused_stale_.fetch_add(1, kRelaxed);
  }
  buckets_[BucketOf(r.staleness())].fetch_add(1, kRelaxed);
  staleness_sum_.fetch_add(r.staleness(), kRelaxed);
  staleness_count_.fetch_add(1, kRelaxed);
  uint64_t prev = staleness_max_.load(kRelaxed);
  while (r.staleness() > prev &&
         !staleness_max_.compare_exchange_weak(prev, r.staleness(), kRelaxed)) {
  }
}

void ShardStats::Snapshot(Counters* c, StalenessHistogram* h, Rates* rates,
                          absl::Duration min_interval) {
  c->set_pulls(pulls_.load(kRelaxed));
  c->set_pushes(pushes_.load(kRelaxed));
  c->set_duplicate_pushes(duplicate_pushes_.load(kRelaxed));
  c->set_updates_applied(updates_applied_.load(kRelaxed));
  c->set_refused_stale(refused_stale_.load(kRelaxed));
  c->set_scaled(scaled_.load(kRelaxed));
  c->set_rejected_bad_input(rejected_bad_input_.load(kRelaxed));
  c->set_bytes_in(bytes_in_.load(kRelaxed));
  c->set_bytes_out(bytes_out_.load(kRelaxed));
  c->set_pull_waits(pull_waits_.load(kRelaxed));
  c->set_pull_wait_timeouts(pull_wait_timeouts_.load(kRelaxed));

  uint64_t total = 0;
  for (int i = 0; i < kBuckets; ++i) {
    const uint64_t n = buckets_[i].load(kRelaxed);
    h->add_upper_bounds(BucketUpperBound(i));
    h->add_counts(n);
    total += n;
  }
  const uint64_t max = staleness_max_.load(kRelaxed);
  h->set_max(max);
  h->set_sum(staleness_sum_.load(kRelaxed));
  const uint64_t count = staleness_count_.load(kRelaxed);
  h->set_mean(count ? static_cast<double>(staleness_sum_.load(kRelaxed)) / count
                    : 0.0);
  // Nearest-rank percentile: the smallest staleness with at least q of the
  // samples at or below it. Exact below 16; above, the lower edge of the
  // bucket, capped by the exact maximum.
  auto percentile = [&](double q) -> uint64_t {
    if (total == 0) return 0;
    const uint64_t rank = std::max<uint64_t>(
        1, static_cast<uint64_t>(std::ceil(q * static_cast<double>(total))));
    uint64_t seen = 0;
    for (int i = 0; i < kBuckets; ++i) {
      seen += h->counts(i);
      if (seen >= rank) {
        const uint64_t lower = i == 0 ? 0 : BucketUpperBound(i - 1);
        return std::min(lower, max);
      }
    }
    return max;
  };
  h->set_p50(percentile(0.50));
  h->set_p90(percentile(0.90));
  h->set_p99(percentile(0.99));

  absl::MutexLock l(&mu_);
  const absl::Time now = absl::Now();
  const absl::Duration dt = now - last_time_;
  if (dt >= min_interval) {
    const double s = absl::ToDoubleSeconds(dt);
    last_rates_.set_interval_s(s);
    last_rates_.set_pushes_per_s((c->pushes() - last_.pushes()) / s);
    last_rates_.set_pulls_per_s((c->pulls() - last_.pulls()) / s);
    last_rates_.set_updates_per_s(
        (c->updates_applied() - last_.updates_applied()) / s);
    last_rates_.set_bytes_in_per_s((c->bytes_in() - last_.bytes_in()) / s);
    last_rates_.set_bytes_out_per_s((c->bytes_out() - last_.bytes_out()) / s);
    last_ = *c;
    last_time_ = now;
  }
  *rates = last_rates_;
}

}  // namespace asyncps
