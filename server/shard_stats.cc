#include "server/shard_stats.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace asyncps {

namespace {
constexpr auto kRelaxed = std::memory_order_relaxed;
}  // namespace

ShardStats::ShardStats() {
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
  if (staleness < kExactBuckets) return static_cast<int>(staleness);
  for (int i = kExactBuckets; i < kBuckets - 1; ++i) {
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

void ShardStats::RecordStep() { steps_.fetch_add(1, kRelaxed); }

void ShardStats::RecordBadInput() {
  rejected_bad_input_.fetch_add(1, kRelaxed);
}

void ShardStats::RecordMisrouted() { misrouted_.fetch_add(1, kRelaxed); }

uint64_t ShardStats::DataCalls() const {
  return pulls_.load(kRelaxed) + pushes_.load(kRelaxed) +
         duplicate_pushes_.load(kRelaxed) + misrouted_.load(kRelaxed);
}

void ShardStats::RecordPush(uint64_t bytes_in, bool duplicate,
                            const PushResponse& response) {
  pushes_.fetch_add(1, kRelaxed);
  bytes_in_.fetch_add(bytes_in, kRelaxed);
  if (duplicate) {
    duplicate_pushes_.fetch_add(1, kRelaxed);
    return;
  }
  // Added up here, published with one atomic add per nonzero total.
  uint64_t applied = 0, stale = 0, restored = 0, scaled = 0;
  uint64_t sum = 0, count = 0, max = 0;
  std::array<uint64_t, kBuckets> buckets{};
  for (const SliceResult& r : response.results()) {
    switch (r.outcome()) {
      case APPLIED:
        ++applied;
        if (r.lr_scale() < 1.0f) ++scaled;
        break;
      case REFUSED_STALE:
        ++stale;
        break;
      default:
        ++restored;  // staleness unknown: not in the histogram
        continue;
    }
    ++buckets[BucketOf(r.staleness())];
    sum += r.staleness();
    ++count;
    max = std::max(max, r.staleness());
  }
  if (applied) updates_applied_.fetch_add(applied, kRelaxed);
  if (stale) refused_stale_.fetch_add(stale, kRelaxed);
  if (restored) refused_restored_.fetch_add(restored, kRelaxed);
  if (scaled) scaled_.fetch_add(scaled, kRelaxed);
  if (count == 0) return;
  for (int i = 0; i < kBuckets; ++i) {
    if (buckets[i]) buckets_[i].fetch_add(buckets[i], kRelaxed);
  }
  staleness_sum_.fetch_add(sum, kRelaxed);
  staleness_count_.fetch_add(count, kRelaxed);
  uint64_t prev = staleness_max_.load(kRelaxed);
  while (max > prev &&
         !staleness_max_.compare_exchange_weak(prev, max, kRelaxed)) {
  }
}

void ShardStats::FillCounters(Counters* c) const {
  c->set_pulls(pulls_.load(kRelaxed));
  c->set_pushes(pushes_.load(kRelaxed));
  c->set_duplicate_pushes(duplicate_pushes_.load(kRelaxed));
  c->set_updates_applied(updates_applied_.load(kRelaxed));
  c->set_refused_stale(refused_stale_.load(kRelaxed));
  c->set_refused_restored(refused_restored_.load(kRelaxed));
  c->set_scaled(scaled_.load(kRelaxed));
  c->set_rejected_bad_input(rejected_bad_input_.load(kRelaxed));
  c->set_bytes_in(bytes_in_.load(kRelaxed));
  c->set_bytes_out(bytes_out_.load(kRelaxed));
  c->set_pull_waits(pull_waits_.load(kRelaxed));
  c->set_pull_wait_timeouts(pull_wait_timeouts_.load(kRelaxed));
  c->set_misrouted_calls(misrouted_.load(kRelaxed));
  c->set_steps(steps_.load(kRelaxed));
}

void ShardStats::Sample(absl::Time now) {
  RateSample sample;
  sample.time = now;
  FillCounters(&sample.counters);
  absl::MutexLock l(&mu_);
  samples_.push_back(std::move(sample));
  // Keep the newest sample and enough older ones to span the window.
  while (samples_.size() > 2 &&
         samples_.back().time - samples_[1].time >= kRateWindow) {
    samples_.pop_front();
  }
}

void ShardStats::Snapshot(Counters* c, StalenessHistogram* h,
                          Rates* rates) const {
  FillCounters(c);
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
  if (samples_.size() < 2) return;
  const RateSample& a = samples_.front();
  const RateSample& b = samples_.back();
  const double s = absl::ToDoubleSeconds(b.time - a.time);
  if (s <= 0) return;
  const Counters& x = a.counters;
  const Counters& y = b.counters;
  rates->set_interval_s(s);
  rates->set_pushes_per_s((y.pushes() - x.pushes()) / s);
  rates->set_pulls_per_s((y.pulls() - x.pulls()) / s);
  rates->set_updates_per_s((y.updates_applied() - x.updates_applied()) / s);
  rates->set_bytes_in_per_s((y.bytes_in() - x.bytes_in()) / s);
  rates->set_bytes_out_per_s((y.bytes_out() - x.bytes_out()) / s);
}

}  // namespace asyncps
