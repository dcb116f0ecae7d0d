#ifndef ASYNCPS_TESTS_BENCH_CEILING_MODEL_H_
#define ASYNCPS_TESTS_BENCH_CEILING_MODEL_H_

// The parameters a ceiling server of push_pull_bench works on.
//
// With a model size, one vector of that size shared by all the server's
// connections, each call addressing the model's next call-sized part in
// turn: the working set is a real model's, far larger than the caches, as
// a shard's is. Without one, each connection's own vector of the call's
// size, which stays in cache: the most generous ceiling, not one any
// parameter server over a real model can approach.
//
// Concurrent calls address different parts unless more calls are in
// flight than the model has parts (then they may overlap, as unsynchronized
// SGD may; a bench, not a store).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace asyncps {
namespace bench {

class CeilingModel {
 public:
  // `model_floats` 0: each connection's own vector.
  explicit CeilingModel(size_t model_floats) : shared_(model_floats, 0.0f) {}

  // The `n` floats the next call of `n` floats works on: a part of the
  // shared model when it holds at least one such part, else `own` (the
  // connection's vector, grown to n).
  float* Next(size_t n, std::vector<float>* own) {
    const size_t parts = n == 0 ? 0 : shared_.size() / n;
    if (parts == 0) {
      if (own->size() < n) own->resize(n, 0.0f);
      return own->data();
    }
    const uint64_t part = next_.fetch_add(1, std::memory_order_relaxed) % parts;
    return shared_.data() + part * n;
  }

 private:
  std::vector<float> shared_;
  std::atomic<uint64_t> next_{0};
};

}  // namespace bench
}  // namespace asyncps

#endif  // ASYNCPS_TESTS_BENCH_CEILING_MODEL_H_
