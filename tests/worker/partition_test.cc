// Spec for worker data shares and per-epoch shuffles.

#include "worker/partition.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace asyncps {
namespace {

TEST_CASE("worker shares cover every index exactly once", "[partition]") {
  for (int64_t n :
       {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{13}, int64_t{60000}}) {
    for (int workers = 1; workers <= 7; ++workers) {
      INFO("n=" << n << " workers=" << workers);
      std::vector<int> seen(n, 0);
      int64_t next = 0, min_size = n, max_size = 0;
      for (int w = 0; w < workers; ++w) {
        auto share = WorkerShare(n, workers, w);
        REQUIRE(share.ok());
        // Contiguous and in worker order.
        REQUIRE(share->begin == next);
        REQUIRE(share->end >= share->begin);
        next = share->end;
        min_size = std::min(min_size, share->size());
        max_size = std::max(max_size, share->size());
        for (int64_t i = share->begin; i < share->end; ++i) ++seen[i];
      }
      CHECK(next == n);
      CHECK(max_size - min_size <= 1);
      CHECK(
          std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
    }
  }
}

TEST_CASE("worker shares reject invalid arguments", "[partition]") {
  CHECK(absl::IsInvalidArgument(WorkerShare(10, 0, 0).status()));
  CHECK(absl::IsInvalidArgument(WorkerShare(10, -2, 0).status()));
  CHECK(absl::IsInvalidArgument(WorkerShare(10, 3, 3).status()));
  CHECK(absl::IsInvalidArgument(WorkerShare(10, 3, -1).status()));
  CHECK(absl::IsInvalidArgument(WorkerShare(-1, 3, 0).status()));
}

TEST_CASE("a training plan: share, steps per epoch and in all", "[partition]") {
  // 1000 examples over 3 workers: 334, 333, 333; batches of 64.
  absl::StatusOr<TrainingPlan> p = PlanTraining(1000, 3, 0, 64, 5, 0);
  REQUIRE(p.ok());
  CHECK(p->share.begin == 0);
  CHECK(p->share.end == 334);
  CHECK(p->steps_per_epoch == 6);  // 5 full batches and one of 14
  CHECK(p->total_steps == 30);
  p = PlanTraining(1000, 3, 2, 333, 5, 0);
  REQUIRE(p.ok());
  CHECK(p->share.begin == 667);
  CHECK(p->steps_per_epoch == 1);  // exactly one full batch
  p = PlanTraining(1000, 3, 1, 64, 5, 7);
  REQUIRE(p.ok());
  CHECK(p->total_steps == 7);  // max_steps wins
  // 2 examples over 3 workers: worker 2 has none.
  CHECK(absl::IsInvalidArgument(PlanTraining(2, 3, 2, 64, 1, 0).status()));
  CHECK(absl::IsInvalidArgument(PlanTraining(1000, 3, 0, 0, 1, 0).status()));
  CHECK(absl::IsInvalidArgument(PlanTraining(1000, 3, 0, 64, 0, 0).status()));
  CHECK(absl::IsInvalidArgument(PlanTraining(1000, 3, 3, 64, 1, 0).status()));
}

TEST_CASE("an epoch order is a permutation of the share", "[partition]") {
  auto share = WorkerShare(60000, 7, 3);
  REQUIRE(share.ok());
  std::vector<int64_t> order = EpochOrder(*share, 1234, 3, 0);
  REQUIRE(static_cast<int64_t>(order.size()) == share->size());
  std::vector<int64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < share->size(); ++i) {
    REQUIRE(sorted[i] == share->begin + i);
  }
  // Shuffled, not the identity.
  CHECK(order != sorted);
  CHECK(EpochOrder(Share{5, 5}, 1, 0, 0).empty());
  CHECK(EpochOrder(Share{5, 6}, 1, 0, 0) == std::vector<int64_t>{5});
}

TEST_CASE("epoch orders are deterministic per seed and differ across epochs",
          "[partition]") {
  const Share share{100, 1100};
  const std::vector<int64_t> a = EpochOrder(share, 42, 1, 0);
  CHECK(EpochOrder(share, 42, 1, 0) == a);  // same inputs, same order
  CHECK(EpochOrder(share, 42, 1, 1) != a);  // next epoch
  CHECK(EpochOrder(share, 43, 1, 0) != a);  // other seed
  CHECK(EpochOrder(share, 42, 2, 0) != a);  // other worker
  CHECK(EpochOrder(share, 42, 1, 1) == EpochOrder(share, 42, 1, 1));
}

TEST_CASE("epoch orders do not depend on the standard library", "[partition]") {
  // Golden prefix: the shuffle is specified (mt19937_64 + Fisher-Yates), so
  // any conforming platform gives these exact indices.
  const std::vector<int64_t> order = EpochOrder(Share{0, 10}, 7, 0, 0);
  const std::vector<int64_t> golden = {9, 4, 1, 6, 5, 3, 8, 0, 2, 7};
  CHECK(order == golden);
}

}  // namespace
}  // namespace asyncps
