// SnapshotKeeper (serving/snapshot.h) over a scripted source: snapshots
// carry the source's values and versions; a failed refresh keeps the last
// snapshot; a tensor whose size changed is refused, naming it, instead of
// reaching a model built for the old size.

#include "serving/snapshot.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "catch2/catch.hpp"
#include "common/logging.h"
#include "serving/parameter_source.h"
#include "tests/testing/require_ok.h"

namespace asyncps {
namespace {

// Tensors of given values; every Read reports `version` for each.
class ScriptedSource : public ParameterSource {
 public:
  absl::StatusOr<ListTensorsResponse> List() override {
    if (!fail.ok()) return fail;
    ListTensorsResponse list;
    for (const auto& [name, values] : tensors) {
      TensorSpec* t = list.add_tensors();
      t->set_name(name);
      t->add_shape(static_cast<int64_t>(values.size()));
    }
    return list;
  }
  absl::Status Read(const std::vector<std::pair<std::string, float*>>& outs,
                    std::vector<uint64_t>* versions) override {
    versions->clear();
    for (const auto& [name, out] : outs) {
      const std::vector<float>& v = tensors.at(name);
      std::copy(v.begin(), v.end(), out);
      versions->push_back(version);
    }
    return absl::OkStatus();
  }
  absl::Status ReadRows(const std::string&, absl::Span<const uint64_t>,
                        float*) override {
    return absl::UnimplementedError("no tables");
  }
  std::string Describe() const override { return "scripted source"; }

  std::map<std::string, std::vector<float>> tensors;
  uint64_t version = 1;
  absl::Status fail;
};

TEST_CASE("snapshots follow the source and keep the served sizes",
          "[serving][snapshot]") {
  ScriptedSource source;
  source.tensors = {{"w", {1, 2, 3}}, {"b", {0.5f}}};
  SnapshotKeeper keeper(&source, {"w", "b"}, absl::ZeroDuration(),
                        NullLogger());
  CHECK(keeper.Current() == nullptr);
  REQUIRE_OK(keeper.Refresh());
  std::shared_ptr<const Snapshot> first = keeper.Current();
  REQUIRE(first != nullptr);
  CHECK(first->values == std::vector<std::vector<float>>{{1, 2, 3}, {0.5f}});
  CHECK(first->version_sum == 2);

  // New values of the same sizes: a new snapshot.
  source.tensors["w"] = {4, 5, 6};
  source.version = 7;
  REQUIRE_OK(keeper.Refresh());
  std::shared_ptr<const Snapshot> second = keeper.Current();
  CHECK(second->id > first->id);
  CHECK(second->values[0] == std::vector<float>{4, 5, 6});
  CHECK(second->version_sum == 14);

  // The source fails: the last snapshot stays, the failure is counted.
  source.fail = absl::UnavailableError("shard 1 is down");
  CHECK(absl::IsUnavailable(keeper.Refresh()));
  CHECK(keeper.Current() == second);
  CHECK(keeper.refresh_failures() == 1);
  CHECK(keeper.last_error().find("shard 1 is down") != std::string::npos);
  source.fail = absl::OkStatus();

  // "w" now has 4 elements: refused, naming it; the model keeps its
  // snapshot of 3.
  source.tensors["w"] = {1, 1, 1, 1};
  absl::Status s = keeper.Refresh();
  INFO(s.ToString());
  CHECK(absl::IsFailedPrecondition(s));
  CHECK(s.message().find("now holds 4 elements of 'w', the served model 3") !=
        std::string::npos);
  CHECK(keeper.Current() == second);
  CHECK(keeper.refresh_failures() == 2);

  // Back to its size: served again.
  source.tensors["w"] = {7, 8, 9};
  REQUIRE_OK(keeper.Refresh());
  CHECK(keeper.Current()->values[0] == std::vector<float>{7, 8, 9});
  CHECK(keeper.last_error().empty());
}

}  // namespace
}  // namespace asyncps
