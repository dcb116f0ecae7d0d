#ifndef ASYNCPS_TESTS_SERVING_FAKE_MODEL_H_
#define ASYNCPS_TESTS_SERVING_FAKE_MODEL_H_

// A parameter source of one scalar tensor "v" whose value the test sets, and
// a batch runner computing out = [x0 + v, x1 * v] per row, for batcher tests
// whose answers are known exactly.

#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "serving/batcher.h"
#include "serving/parameter_source.h"

namespace asyncps {
namespace testing {

class ScalarSource : public ParameterSource {
 public:
  absl::StatusOr<ListTensorsResponse> List() override {
    if (down.load()) return absl::UnavailableError("source down");
    ListTensorsResponse list;
    TensorSpec* spec = list.add_tensors();
    spec->set_name("v");
    spec->add_shape(1);
    return list;
  }
  absl::Status ReadRows(const std::string& table, absl::Span<const uint64_t>,
                        float*) override {
    return absl::NotFoundError("no table " + table);
  }
  absl::Status Read(const std::vector<std::pair<std::string, float*>>& outs,
                    std::vector<uint64_t>* versions) override {
    if (down.load()) return absl::UnavailableError("source down");
    *outs[0].second = value.load();
    versions->assign(1, version.load());
    return absl::OkStatus();
  }
  std::string Describe() const override { return "scalar"; }

  std::atomic<float> value{1.0f};
  std::atomic<uint64_t> version{0};
  std::atomic<bool> down{false};
};

class ScalarRunner : public BatchRunner {
 public:
  // `gate` (if set) holds every Run until notified.
  explicit ScalarRunner(absl::Notification* gate = nullptr) : gate_(gate) {}

  absl::Status Run(const Snapshot& snapshot, const float* x,
                   const uint64_t* /*ids*/, int rows, float* out) override {
    if (gate_ != nullptr) gate_->WaitForNotification();
    const float v = snapshot.values[0][0];
    for (int r = 0; r < rows; ++r) {
      out[2 * r] = x[2 * r] + v;
      out[2 * r + 1] = x[2 * r + 1] * v;
    }
    rows_computed.fetch_add(rows);
    batches.fetch_add(1);
    return absl::OkStatus();
  }

  std::atomic<int> rows_computed{0};
  std::atomic<int> batches{0};

 private:
  absl::Notification* const gate_;
};

}  // namespace testing
}  // namespace asyncps

#endif  // ASYNCPS_TESTS_SERVING_FAKE_MODEL_H_
