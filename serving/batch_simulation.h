#ifndef ASYNCPS_SERVING_BATCH_SIMULATION_H_
#define ASYNCPS_SERVING_BATCH_SIMULATION_H_

// What a batch wait would do to latency, by simulating the batcher's own
// rule (batcher.h) on a fixed sample of Poisson arrivals.
//
// The rule, for k batch threads sharing one FIFO queue: a free thread takes
// the oldest request; it waits until the queue holds max_batch_rows rows or
// that request has waited T, then takes up to max_batch_rows rows and is
// busy for c(b) = a + s * b (a batch thread's measured time per batch,
// computing and answering); every request of the batch is answered by its
// end. Simulated exactly (one row per request), this captures what closed
// forms of queueing do not: a busy thread lets the next batch gather by
// itself, so at any load where the threads are rarely idle the wait barely
// changes batch sizes, while at light load it is added to every request.
// (An M/D/1 approximation predicted 13 ms where this gives 3.9 ms, for
// a = 1 ms, s = 75 us and 8000 rows/s, and picked waits that add 5-8% to
// the mean.)
//
// The arrival sample (Exp(1) gaps, scaled by the rate) is drawn once, so
// every candidate wait is judged on the same arrivals and a prediction is
// a deterministic function of its inputs. Its first eighth is warm-up and
// not counted. Cost: O(arrivals) per prediction, 5-15 us for the default
// sample with -O2.
//
// Thread-safe (immutable after construction).

#include <cstdint>
#include <vector>

namespace asyncps {

// The measured inputs.
struct BatchingLoad {
  double rows_per_s = 0;
  double fixed_us = 0;    // a
  double per_row_us = 0;  // s
  int max_batch_rows = 64;
  int threads = 1;
};

struct BatchingOutcome {
  double mean_us = 0;  // mean latency from arrival to answer
  // Share of requests answered later than the objective passed to Predict
  // (0 when none was passed): the p99 is within the objective iff <= 0.01.
  double over_objective = 0;
  double rows = 0;  // mean rows per batch
};

// True when full batches keep up with the arrivals: rows_per_s * c(max) /
// max < threads. When false no wait can keep the queue from growing (a
// simulation then measures a queue still filling at its end).
bool KeepsUp(const BatchingLoad& load);

class BatchSimulator {
 public:
  // `arrivals` requests (>= 64) from a generator seeded with `seed`.
  explicit BatchSimulator(int arrivals = 2048, uint64_t seed = 1);

  // The outcome of waiting `wait_us` under `load`. `objective_us` > 0
  // also counts the requests answered later than it.
  BatchingOutcome Predict(const BatchingLoad& load, double wait_us,
                          double objective_us = 0) const;

  // Every counted request's latency (microseconds) under `wait_us`, for
  // tests.
  std::vector<double> Latencies(const BatchingLoad& load, double wait_us) const;

 private:
  // Runs the rule; appends every counted latency to `latencies` when it is
  // not null.
  BatchingOutcome Run(const BatchingLoad& load, double wait_us,
                      double objective_us,
                      std::vector<double>* latencies) const;

  std::vector<double> unit_arrivals_;  // cumulative Exp(1) gaps
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVING_BATCH_SIMULATION_H_
