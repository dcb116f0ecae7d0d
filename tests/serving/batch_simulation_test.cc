// The batcher's rule simulated: closed forms where queueing theory has one,
// and what the rule does under load.

#include "serving/batch_simulation.h"

#include <algorithm>
#include <catch2/catch.hpp>

namespace asyncps {
namespace {

BatchingLoad Load(double rows_per_s, double fixed_us, double per_row_us,
                  int threads = 1, int max_batch_rows = 64) {
  BatchingLoad l;
  l.rows_per_s = rows_per_s;
  l.fixed_us = fixed_us;
  l.per_row_us = per_row_us;
  l.threads = threads;
  l.max_batch_rows = max_batch_rows;
  return l;
}

TEST_CASE("a request alone waits the whole window", "[batch_simulation]") {
  const BatchSimulator sim;
  const BatchingOutcome none = sim.Predict(Load(0, 500, 10), 100);
  REQUIRE(none.mean_us == Approx(100 + 510));
  REQUIRE(none.rows == 1);
  // One row a second: another arrives within the 1 ms window about once in
  // a thousand requests.
  const BatchingOutcome rare = sim.Predict(Load(1, 500, 10), 1000);
  REQUIRE(rare.mean_us == Approx(1000 + 510).epsilon(0.005));
  REQUIRE(rare.rows == Approx(1).epsilon(0.005));
}

TEST_CASE("one row per batch without a wait is the M/D/1 queue",
          "[batch_simulation]") {
  // Pollaczek-Khinchine: mean latency c + rho c / (2 (1 - rho)).
  const BatchSimulator sim(1 << 17);
  for (double rho : {0.3, 0.5, 0.7}) {
    const double c = 500;
    const BatchingOutcome o =
        sim.Predict(Load(rho / c * 1e6, c, 0, 1, /*max_batch_rows=*/1), 0);
    INFO("rho " << rho);
    REQUIRE(o.rows == 1);
    REQUIRE(o.mean_us == Approx(c + rho * c / (2 * (1 - rho))).epsilon(0.05));
  }
}

TEST_CASE("a full batch does not wait for the window", "[batch_simulation]") {
  // 64000 rows/s with a 50 ms window: 64 rows gather in about 1 ms.
  const BatchSimulator sim;
  const BatchingOutcome o = sim.Predict(Load(64000, 0, 0), 50000);
  REQUIRE(o.rows == 64);
  REQUIRE(o.mean_us == Approx(63.0 / 2 / 64000 * 1e6).epsilon(0.1));
}

TEST_CASE("a busy thread gathers the next batch by itself",
          "[batch_simulation]") {
  // a = 1 ms, s = 75 us, 8000 rows/s: the thread is rarely idle, so every
  // wait up to 1 ms gives the same batches (about 20 rows, where b =
  // rate * c(b)) and the same latency; an M/D/1 approximation of batches
  // predicted 13 ms.
  const BatchSimulator sim;
  const BatchingLoad load = Load(8000, 1000, 75);
  REQUIRE(KeepsUp(load));
  const BatchingOutcome greedy = sim.Predict(load, 0);
  REQUIRE(greedy.rows == Approx(20).margin(3));
  REQUIRE(greedy.mean_us > 3000);
  REQUIRE(greedy.mean_us < 5000);
  for (double t : {50.0, 200.0, 1000.0}) {
    REQUIRE(sim.Predict(load, t).mean_us ==
            Approx(greedy.mean_us).epsilon(0.01));
  }
  // A 5 ms window makes batches larger and every request later.
  const BatchingOutcome slow = sim.Predict(load, 5000);
  REQUIRE(slow.rows > 35);
  REQUIRE(slow.mean_us > greedy.mean_us + 2000);
}

TEST_CASE("threads and overload", "[batch_simulation]") {
  // Rows of 300 us: 4000 rows/s exceed one thread at any batch size; two
  // threads carry 6000 rows/s.
  REQUIRE(!KeepsUp(Load(4000, 0, 300)));
  REQUIRE(KeepsUp(Load(6000, 0, 300, 2)));
  REQUIRE(!KeepsUp(Load(6000, 0, 300, 1)));
  const BatchSimulator sim;
  // Two threads at a rate one barely carries: less queueing.
  const BatchingLoad one = Load(3000, 0, 300, 1, 1);
  BatchingLoad two = one;
  two.threads = 2;
  REQUIRE(sim.Predict(two, 0).mean_us < 0.5 * sim.Predict(one, 0).mean_us);
}

TEST_CASE("the share over an objective is the latencies' tail",
          "[batch_simulation]") {
  const BatchSimulator sim;
  const BatchingLoad load = Load(5000, 1000, 5, 2);
  std::vector<double> l = sim.Latencies(load, 200);
  REQUIRE(l.size() == 2048 - 2048 / 8);
  std::sort(l.begin(), l.end());
  const double p99 = l[static_cast<size_t>(0.99 * l.size())];
  const BatchingOutcome o = sim.Predict(load, 200, p99);
  REQUIRE(o.over_objective <= 0.01);
  REQUIRE(o.over_objective >= 0.005);
  REQUIRE(sim.Predict(load, 200, 0.5 * p99).over_objective > 0.01);
  double sum = 0;
  for (double x : l) sum += x;
  REQUIRE(o.mean_us == Approx(sum / l.size()));
}

}  // namespace
}  // namespace asyncps
