// The batch wait policy: the latency model's values, a fixed wait, and the
// wait `auto` picks from measured arrivals and batch costs.

#include "serving/batch_policy.h"

#include <catch2/catch.hpp>

namespace asyncps {
namespace {

// Feeds `policy` batches costing fixed_us + per_row_us * rows for sizes
// 1..32, and requests of one row every gap_us for 2 s.
void Feed(BatchPolicy* policy, double fixed_us, double per_row_us,
          double gap_us) {
  for (int i = 0; i < 200; ++i) {
    const int rows = 1 + i % 32;
    policy->RecordBatch(rows, absl::Microseconds(fixed_us + per_row_us * rows));
  }
  absl::Time t = absl::UnixEpoch();
  for (int i = 0; i < 2e6 / gap_us; ++i) {
    t += absl::Microseconds(gap_us);
    policy->RecordArrival(t, 1);
  }
}

TEST_CASE("the latency model", "[batch_policy]") {
  // No load: the request waits T and computes one row.
  BatchPolicy::Prediction idle = BatchPolicy::Predict(100, 0, 500, 10, 64, 1);
  REQUIRE(idle.stable);
  REQUIRE(idle.mean_us == Approx(100 + 510));
  // 1000 rows/s at 510 us a row is over half the thread: queueing.
  BatchPolicy::Prediction busy = BatchPolicy::Predict(0, 1000, 500, 10, 64, 1);
  REQUIRE(busy.stable);
  REQUIRE(busy.mean_us > 510);
  // 4000 rows/s at 510 us one by one would not keep up; the rows that
  // gather while the thread is busy form batches that do.
  BatchPolicy::Prediction greedy =
      BatchPolicy::Predict(0, 4000, 500, 10, 64, 1);
  REQUIRE(greedy.stable);
  REQUIRE(greedy.rows > 2.5);
  REQUIRE(greedy.mean_us > busy.mean_us);
  // Rows costing 300 us each: 4000 rows/s exceed one thread at any batch
  // size and any wait; two threads carry 6000 rows/s.
  for (double t : {0.0, 1000.0, 50000.0}) {
    REQUIRE(!BatchPolicy::Predict(t, 4000, 0, 300, 64, 1).stable);
  }
  REQUIRE(BatchPolicy::Predict(0, 6000, 0, 300, 64, 2).stable);
  REQUIRE(!BatchPolicy::Predict(0, 6000, 0, 300, 64, 1).stable);
}

TEST_CASE("a fixed wait is the operator's", "[batch_policy]") {
  BatchPolicyOptions o;
  o.fixed_timeout = absl::Microseconds(750);
  BatchPolicy policy(o);
  Feed(&policy, 500, 10, 100);
  REQUIRE(policy.Timeout() == absl::Microseconds(750));
}

TEST_CASE("auto waits only when batching pays", "[batch_policy]") {
  BatchPolicyOptions o;
  o.automatic = true;
  o.max_batch_rows = 64;
  {
    // Cost per row only: nothing is gained by waiting.
    BatchPolicy policy(o);
    Feed(&policy, 0, 20, 100);
    REQUIRE(policy.Timeout() == absl::ZeroDuration());
    REQUIRE(policy.Current().per_row_us == Approx(20).margin(0.5));
  }
  {
    // A large fixed cost and 5000 rows/s: one by one would overload
    // (5000 x 1 ms), so it waits to batch.
    BatchPolicy policy(o);
    Feed(&policy, 1000, 5, 200);
    const BatchPolicy::Estimate e = policy.Current();
    REQUIRE(e.fixed_us == Approx(1000).margin(5));
    REQUIRE(e.per_row_us == Approx(5).margin(0.2));
    REQUIRE(e.rows_per_s == Approx(5000).epsilon(0.01));
    REQUIRE(e.timeout > absl::ZeroDuration());
    const double t = absl::ToDoubleMicroseconds(e.timeout);
    const auto chosen = BatchPolicy::Predict(t, 5000, 1000, 5, 64, 1);
    REQUIRE(chosen.stable);
    // No other wait predicts a mean more than 1% lower (the policy
    // searches a grid 22% apart).
    for (double other = 20; other < 50000; other *= 1.1) {
      REQUIRE(chosen.mean_us <=
              1.01 * BatchPolicy::Predict(other, 5000, 1000, 5, 64, 1).mean_us);
    }
  }
  {
    // Low load with a fixed cost: a request rarely finds a batch-mate, and
    // waiting for one costs more than it saves.
    BatchPolicy policy(o);
    Feed(&policy, 1000, 5, 100000);
    REQUIRE(policy.Timeout() < absl::Microseconds(100));
  }
}

TEST_CASE("auto keeps the predicted p99 within the objective",
          "[batch_policy]") {
  BatchPolicyOptions o;
  o.automatic = true;
  o.max_batch_rows = 64;
  BatchPolicy free(o);
  Feed(&free, 1000, 5, 200);
  const double t_free = absl::ToDoubleMicroseconds(free.Timeout());
  const auto unbound = BatchPolicy::Predict(t_free, 5000, 1000, 5, 64, 1);
  // An objective the mean-optimal wait misses, and longer waits meet.
  o.latency_objective = absl::Microseconds(4900);
  REQUIRE(unbound.p99_us > 4900);
  BatchPolicy bound(o);
  Feed(&bound, 1000, 5, 200);
  const double t = absl::ToDoubleMicroseconds(bound.Timeout());
  const auto chosen = BatchPolicy::Predict(t, 5000, 1000, 5, 64, 1);
  REQUIRE(chosen.stable);
  REQUIRE(chosen.p99_us <= 4900);
  REQUIRE(t > t_free);
  REQUIRE(chosen.mean_us >= unbound.mean_us);
}

}  // namespace
}  // namespace asyncps
