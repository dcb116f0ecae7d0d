// ParameterSource of a checkpoint directory (parameter_source.h).
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "common/sharding.h"
#include "common/tensor_layout.h"
#include "server/shard_set.h"
#include "serving/parameter_source.h"

namespace asyncps {
namespace {

class CheckpointSource : public ParameterSource {
 public:
  CheckpointSource(std::vector<RestoredShard> shards, std::string description)
      : shards_(std::move(shards)), description_(std::move(description)) {}

  absl::StatusOr<ListTensorsResponse> List() override {
    ListTensorsResponse list;
    for (TensorSpec& t : shards_[0].store->ListTensors()) {
      *list.add_tensors() = std::move(t);
    }
    for (TableSpec& t : shards_[0].store->tables().List()) {
      *list.add_tables() = std::move(t);
    }
    list.set_run_id(shards_[0].run_id);
    return list;
  }

  absl::Status ReadRows(const std::string& table,
                        absl::Span<const uint64_t> ids, float* out) override {
    const int n = static_cast<int>(shards_.size());
    // Each id to its home shard, remembering its positions.
    std::vector<PullRequest> requests(n);
    std::vector<std::vector<size_t>> positions(n);
    for (size_t i = 0; i < ids.size(); ++i) {
      const int home = RowHome(table, ids[i], n);
      if (requests[home].rows_size() == 0) {
        TableIds* t = requests[home].add_rows();
        t->set_table(table);
        t->set_peek(true);
      }
      requests[home].mutable_rows(0)->add_ids(ids[i]);
      positions[home].push_back(i);
    }
    for (int s = 0; s < n; ++s) {
      if (positions[s].empty()) continue;
      PullResponse response;
      std::string values;
      absl::Status st = shards_[s].store->tables().Pull(
          requests[s], 0, WIRE_F32, &response, [&](int, size_t bytes) {
            values.resize(bytes);
            return &values[0];
          });
      if (!st.ok()) return st;
      const size_t dim = values.size() / sizeof(float) / positions[s].size();
      const float* v = reinterpret_cast<const float*>(values.data());
      for (size_t k = 0; k < positions[s].size(); ++k) {
        std::memcpy(out + positions[s][k] * dim, v + k * dim,
                    dim * sizeof(float));
      }
    }
    return absl::OkStatus();
  }

  absl::Status Read(const std::vector<std::pair<std::string, float*>>& outs,
                    std::vector<uint64_t>* versions) override {
    absl::flat_hash_map<std::string, std::pair<float*, int64_t>> targets;
    for (const TensorSpec& spec : shards_[0].store->ListTensors()) {
      absl::StatusOr<TensorLayout> layout = TensorLayout::FromSpec(spec);
      if (!layout.ok()) return layout.status();
      targets[spec.name()] = {nullptr, layout->slice_elems()};
    }
    PullRequest request;
    for (const auto& [name, buffer] : outs) {
      auto it = targets.find(name);
      if (it == targets.end()) {
        return absl::NotFoundError(
            absl::StrCat("the checkpoint holds no tensor ", QuoteName(name)));
      }
      it->second.first = buffer;
      request.add_tensors(name);
    }
    absl::flat_hash_map<std::string, uint64_t> version_of;
    for (const RestoredShard& shard : shards_) {
      absl::Status s = shard.store->Pull(
          request, [&](const std::string& tensor, uint32_t slice,
                       uint64_t version, absl::Span<const float> values) {
            const auto& [buffer, slice_elems] = targets.at(tensor);
            std::memcpy(buffer + slice * slice_elems, values.data(),
                        values.size() * sizeof(float));
            version_of[tensor] += version;
          });
      if (!s.ok()) return s;
    }
    versions->clear();
    for (const auto& out : outs) versions->push_back(version_of[out.first]);
    return absl::OkStatus();
  }

  std::string Describe() const override { return description_; }

 private:
  // Read only after construction (ShardStore::Pull is thread-safe).
  const std::vector<RestoredShard> shards_;
  const std::string description_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ParameterSource>> MakeCheckpointSource(
    const std::string& dir) {
  absl::StatusOr<ShardFileSet> set = FindShardFileSet(dir);
  if (!set.ok()) return set.status();
  std::vector<RestoredShard> shards;
  for (int i = 0; i < set->num_shards; ++i) {
    absl::StatusOr<RestoredShard> shard = RestoreShard(*set, i);
    if (!shard.ok()) return shard.status();
    if (i > 0 && shard->run_id != shards[0].run_id) {
      return absl::FailedPreconditionError(
          absl::StrCat(dir, " holds shard files of runs '", shards[0].run_id,
                       "' and '", shard->run_id, "': serve one run"));
    }
    shards.push_back(*std::move(shard));
  }
  const std::string description =
      absl::StrCat("checkpoint ", dir, " (", set->num_shards, " shards, run '",
                   shards[0].run_id, "')");
  return std::unique_ptr<ParameterSource>(
      new CheckpointSource(std::move(shards), description));
}

}  // namespace asyncps
