#ifndef ASYNCPS_WORKER_PARTITION_H_
#define ASYNCPS_WORKER_PARTITION_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace asyncps {

// The examples [begin, end) of a data set that one worker trains on.
struct Share {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// Worker `worker` of `num_workers` gets a contiguous block of [0, n); the
// blocks are disjoint, cover [0, n) in worker order, and their sizes differ
// by at most one (the first n % num_workers workers get one extra).
// INVALID_ARGUMENT unless n >= 0, num_workers > 0 and
// 0 <= worker < num_workers. A pure function.
absl::StatusOr<Share> WorkerShare(int64_t n, int num_workers, int worker);

// What one worker trains: its share of n examples and its steps of
// `batch_size` (the last batch of an epoch may be short).
struct TrainingPlan {
  Share share;
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;  // max_steps if > 0, else epochs x steps_per_epoch
};

// WorkerShare's checks, plus INVALID_ARGUMENT for an empty share or
// batch_size / epochs < 1.
absl::StatusOr<TrainingPlan> PlanTraining(int64_t n, int num_workers,
                                          int worker, int64_t batch_size,
                                          int64_t epochs, int64_t max_steps);

// The indices of `share` in a shuffled order for one epoch. The order is a
// pure function of (share, seed, worker, epoch) and is the same on every
// platform: a Fisher-Yates shuffle driven by std::mt19937_64 (fully
// specified by the standard) seeded with a mix of the three values; unlike
// std::shuffle it does not depend on the standard library's implementation.
std::vector<int64_t> EpochOrder(const Share& share, uint64_t seed, int worker,
                                int64_t epoch);

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_PARTITION_H_
