#include "worker/partition.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace asyncps {
namespace {

// SplitMix64 finalizer: a bijective 64-bit mixer, so distinct inputs give
// well-spread distinct seeds.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in [0, bound) by rejection (no modulo bias). REQUIRES: bound > 0.
uint64_t UniformBelow(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t r;
  do {
    r = rng();
  } while (r >= limit);
  return r % bound;
}

}  // namespace

absl::StatusOr<Share> WorkerShare(int64_t n, int num_workers, int worker) {
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data set size must be >= 0, got ", n));
  }
  if (num_workers <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("number of workers must be > 0, got ", num_workers));
  }
  if (worker < 0 || worker >= num_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker index ", worker, " is outside [0, ", num_workers, ")"));
  }
  const int64_t base = n / num_workers;
  const int64_t extra = n % num_workers;
  Share s;
  s.begin = worker * base + std::min<int64_t>(worker, extra);
  s.end = s.begin + base + (worker < extra ? 1 : 0);
  return s;
}

absl::StatusOr<TrainingPlan> PlanTraining(int64_t n, int num_workers,
                                          int worker, int64_t batch_size,
                                          int64_t epochs, int64_t max_steps) {
  if (batch_size < 1 || epochs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch size and epochs must be >= 1, got ", batch_size,
                     " and ", epochs));
  }
  absl::StatusOr<Share> share = WorkerShare(n, num_workers, worker);
  if (!share.ok()) return share.status();
  if (share->size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", worker, " of ", num_workers, " has no training examples"));
  }
  TrainingPlan plan;
  plan.share = *share;
  plan.steps_per_epoch = (share->size() + batch_size - 1) / batch_size;
  plan.total_steps = max_steps > 0 ? max_steps : epochs * plan.steps_per_epoch;
  return plan;
}

std::vector<int64_t> EpochOrder(const Share& share, uint64_t seed, int worker,
                                int64_t epoch) {
  std::vector<int64_t> order;
  if (share.size() <= 0) return order;
  order.resize(share.size());
  for (int64_t i = 0; i < share.size(); ++i) order[i] = share.begin + i;
  const uint64_t mixed = Mix(Mix(Mix(seed) ^ static_cast<uint64_t>(worker)) ^
                             static_cast<uint64_t>(epoch));
  std::mt19937_64 rng(mixed);
  for (size_t i = order.size() - 1; i > 0; --i) {
    const size_t j = static_cast<size_t>(UniformBelow(rng, i + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

}  // namespace asyncps
