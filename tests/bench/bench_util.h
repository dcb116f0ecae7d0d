#ifndef ASYNCPS_TESTS_BENCH_BENCH_UTIL_H_
#define ASYNCPS_TESTS_BENCH_BENCH_UTIL_H_

// Small helpers the benchmarks share.
//
// Example:
//
//   const std::string dir = BenchDir(absl::GetFlag(FLAGS_dir));
//   const double ms = Median(times);

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

namespace asyncps {

// The median of `v` (the upper one of an even count).
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The q-quantile of `v` (0 for none): the element at rank q * size.
inline double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(q * v.size()));
  std::nth_element(v.begin(), v.begin() + k, v.end());
  return v[k];
}

// Seconds from `a` to `b`.
inline double Seconds(std::chrono::steady_clock::time_point a,
                      std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// `flag` when set, else $TEST_TMPDIR, else /tmp: where a benchmark writes
// its files.
inline std::string BenchDir(const std::string& flag) {
  if (!flag.empty()) return flag;
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp != nullptr ? tmp : "/tmp";
}

}  // namespace asyncps

#endif  // ASYNCPS_TESTS_BENCH_BENCH_UTIL_H_
