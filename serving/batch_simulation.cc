#include "serving/batch_simulation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

namespace asyncps {

bool KeepsUp(const BatchingLoad& load) {
  const int cap = std::max(1, load.max_batch_rows);
  const double full =
      std::max(0.0, load.fixed_us) + std::max(0.0, load.per_row_us) * cap;
  return load.rows_per_s * 1e-6 * full / cap < std::max(1, load.threads);
}

BatchSimulator::BatchSimulator(int arrivals, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::exponential_distribution<double> gap(1.0);
  unit_arrivals_.resize(static_cast<size_t>(std::max(arrivals, 64)));
  double t = 0;
  for (double& a : unit_arrivals_) {
    t += gap(gen);
    a = t;
  }
}

BatchingOutcome BatchSimulator::Predict(const BatchingLoad& load,
                                        double wait_us,
                                        double objective_us) const {
  return Run(load, wait_us, objective_us, nullptr);
}

std::vector<double> BatchSimulator::Latencies(const BatchingLoad& load,
                                              double wait_us) const {
  std::vector<double> out;
  Run(load, wait_us, 0, &out);
  return out;
}

BatchingOutcome BatchSimulator::Run(const BatchingLoad& load, double wait_us,
                                    double objective_us,
                                    std::vector<double>* latencies) const {
  BatchingOutcome o;
  const int cap = std::max(1, load.max_batch_rows);
  const int k = std::max(1, load.threads);
  const double a = std::max(0.0, load.fixed_us);
  const double s = std::max(0.0, load.per_row_us);
  const double t = std::max(0.0, wait_us);
  if (load.rows_per_s <= 0) {
    // No other request ever arrives: each waits the whole window alone.
    o.rows = 1;
    o.mean_us = t + a + s;
    o.over_objective = objective_us > 0 && o.mean_us > objective_us ? 1 : 0;
    if (latencies != nullptr) latencies->push_back(o.mean_us);
    return o;
  }
  const double scale = 1e6 / load.rows_per_s;  // microseconds per unit
  const std::vector<double>& u = unit_arrivals_;
  const int n = static_cast<int>(u.size());
  const int warm = n / 8;
  std::vector<double> free(static_cast<size_t>(k), 0.0);  // thread free at
  double sum = 0;
  int64_t counted = 0, over = 0, batches = 0, batch_rows = 0;
  int i = 0;
  while (i < n) {
    auto thread = std::min_element(free.begin(), free.end());
    const double first = u[i] * scale;
    const double start = std::max(*thread, first);
    const double full = i + cap - 1 < n
                            ? u[i + cap - 1] * scale
                            : std::numeric_limits<double>::infinity();
    const double close = std::max(start, std::min(first + t, full));
    int j = i + 1;
    while (j < n && j - i < cap && u[j] * scale <= close) ++j;
    const double finish = close + a + s * (j - i);
    if (i >= warm) {
      ++batches;
      batch_rows += j - i;
    }
    for (int m = std::max(i, warm); m < j; ++m) {
      const double latency = finish - u[m] * scale;
      sum += latency;
      ++counted;
      if (objective_us > 0 && latency > objective_us) ++over;
      if (latencies != nullptr) latencies->push_back(latency);
    }
    *thread = finish;
    i = j;
  }
  o.mean_us = counted > 0 ? sum / counted : 0;
  o.over_objective = counted > 0 ? static_cast<double>(over) / counted : 0;
  o.rows = batches > 0 ? static_cast<double>(batch_rows) / batches : 1;
  return o;
}

}  // namespace asyncps
