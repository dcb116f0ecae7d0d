#ifndef ASYNCPS_TESTS_BENCH_BENCH_UTIL_H_
#define ASYNCPS_TESTS_BENCH_BENCH_UTIL_H_

// Small helpers the file benchmarks share.
//
// Example:
//
//   const std::string dir = BenchDir(absl::GetFlag(FLAGS_dir));
//   const double ms = Median(times);

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

namespace asyncps {

// The median of `v` (the upper one of an even count).
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
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
