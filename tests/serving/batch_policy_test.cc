// The batch wait policy: the latency model's values, a fixed wait, and the
// wait `auto` picks from measured arrivals and batch costs.

#include "serving/batch_policy.h"

#include <catch2/catch.hpp>

namespace asyncps {
namespace {

// Feeds `policy` batches costing fixed_us + per_row_us * rows for sizes
// 1..32, and requests of one row every gap_us.
void Feed(BatchPolicy* policy, double fixed_us, double per_row_us,
          double gap_us) {
  for (int i = 0; i < 200; ++i) {
    const int rows = 1 + i % 32;
    policy->RecordBatch(rows, absl::Microseconds(fixed_us + per_row_us * rows));
  }
  absl::Time t = absl::UnixEpoch();
  for (int i = 0; i < 400; ++i) {
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
  // 4000 rows/s one by one cannot keep up; batches of ~5 can.
  REQUIRE(!BatchPolicy::Predict(0, 4000, 500, 10, 64, 1).stable);
  REQUIRE(BatchPolicy::Predict(1000, 4000, 500, 10, 64, 1).stable);
  // Two threads carry twice the load.
  REQUIRE(BatchPolicy::Predict(0, 2500, 500, 10, 64, 2).stable);
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
  o.latency_objective = absl::Milliseconds(8);
  BatchPolicy policy(o);
  Feed(&policy, 1000, 5, 200);
  const double t = absl::ToDoubleMicroseconds(policy.Timeout());
  const auto chosen = BatchPolicy::Predict(t, 5000, 1000, 5, 64, 1);
  REQUIRE(chosen.stable);
  REQUIRE(chosen.p99_us <= 8000);
}

}  // namespace
}  // namespace asyncps
