// ParameterSource of a checkpoint directory (parameter_source.h).
#include <cstring>
#include <memory>
#include <tuple>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/names.h"
#include "common/shard_map.h"
#include "common/tensor_layout.h"
#include "server/shard_set.h"
#include "serving/parameter_source.h"

namespace asyncps {
namespace {

// A checkpoint directory's shards as restored once.
struct RestoredSet {
  std::vector<RestoredShard> shards;
  std::string description;
};

// What identifies a file's content without reading it: a rename (how
// checkpoints and spec files are replaced) gives a new inode.
using FileStamp = std::tuple<std::string, uint64_t, uint64_t, int64_t>;

absl::StatusOr<std::vector<FileStamp>> Stamps(const ShardFileSet& set,
                                              FileSystem* fs) {
  std::vector<FileStamp> stamps;
  // Deltas too: a new delta is a newer state of its shard.
  for (const std::string& path : AllFiles(set)) {
    absl::StatusOr<FileStat> st = fs->Stat(path);
    if (!st.ok()) return st.status();
    stamps.emplace_back(path, st->inode, st->size, st->modified_ns);
  }
  return stamps;
}

// Every shard of `set`, restored; one run.
absl::StatusOr<std::shared_ptr<const RestoredSet>> RestoreSet(
    const ShardFileSet& set, FileSystem* fs) {
  auto restored = std::make_shared<RestoredSet>();
  std::vector<RestoredShard>& shards = restored->shards;
  for (int i = 0; i < set.num_shards; ++i) {
    absl::StatusOr<RestoredShard> shard = RestoreShard(set, i, fs);
    if (!shard.ok()) return shard.status();
    if (i > 0 && shard->run_id != shards[0].run_id) {
      return absl::FailedPreconditionError(absl::StrCat(
          set.dir, " holds shard files of runs '", shards[0].run_id, "' and '",
          shard->run_id, "': serve one run"));
    }
    if (i > 0 && shard->store->map() != shards[0].store->map()) {
      return absl::FailedPreconditionError(absl::StrCat(
          set.dir, " holds shard files of the ",
          shards[0].store->map().DebugString(), " and of the ",
          shard->store->map().DebugString(), ": serve one map's files"));
    }
    shards.push_back(*std::move(shard));
  }
  restored->description =
      absl::StrCat("checkpoint ", set.dir, " (", set.num_shards,
                   " shards, run '", shards[0].run_id, "')");
  return std::shared_ptr<const RestoredSet>(std::move(restored));
}

// OK when every tensor and table `before` holds has the same shape (dim) in
// `after`: what the served model and its row buffers were built for.
absl::Status SameShapes(const RestoredSet& before, const RestoredSet& after) {
  absl::flat_hash_map<std::string, std::string> shapes;
  for (const TensorSpec& t : after.shards[0].store->ListTensors()) {
    shapes[t.name()] = absl::StrJoin(t.shape(), "x");
  }
  for (const TableSpec& t : after.shards[0].store->tables().List()) {
    shapes[t.name()] = absl::StrCat("rows of ", t.dim());
  }
  auto check = [&](const std::string& name,
                   const std::string& shape) -> absl::Status {
    auto it = shapes.find(name);
    if (it != shapes.end() && it->second == shape) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(after.description, ": ", QuoteName(name), " is now ",
                     it == shapes.end() ? "gone" : it->second, ", was ", shape,
                     " (another run?): restart ps_serve to serve it"));
  };
  for (const TensorSpec& t : before.shards[0].store->ListTensors()) {
    absl::Status s = check(t.name(), absl::StrJoin(t.shape(), "x"));
    if (!s.ok()) return s;
  }
  for (const TableSpec& t : before.shards[0].store->tables().List()) {
    absl::Status s = check(t.name(), absl::StrCat("rows of ", t.dim()));
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// Follows the directory: List (the first call of every snapshot refresh)
// restores the shard files again when any of them changed (a shard wrote a
// newer checkpoint), so that a server reading the checkpoints of a run in
// progress serves its newer parameters; Read and ReadRows use what List
// last loaded. A failed reload keeps the previous set (and is the
// refresh's error). Holds two copies of the model while reloading.
class CheckpointSource : public ParameterSource {
 public:
  CheckpointSource(std::string dir, FileSystem* fs,
                   std::vector<FileStamp> stamps,
                   std::shared_ptr<const RestoredSet> loaded)
      : dir_(std::move(dir)),
        fs_(fs),
        stamps_(std::move(stamps)),
        loaded_(std::move(loaded)) {}

  absl::StatusOr<ListTensorsResponse> List() override {
    absl::StatusOr<std::shared_ptr<const RestoredSet>> set = Follow();
    if (!set.ok()) return set.status();
    const std::vector<RestoredShard>& shards = (*set)->shards;
    ListTensorsResponse list;
    for (TensorSpec& t : shards[0].store->ListTensors()) {
      *list.add_tensors() = std::move(t);
    }
    for (TableSpec& t : shards[0].store->tables().List()) {
      *list.add_tables() = std::move(t);
    }
    list.set_run_id(shards[0].run_id);
    return list;
  }

  absl::Status ReadRows(const std::string& table,
                        absl::Span<const uint64_t> ids, float* out) override {
    const std::shared_ptr<const RestoredSet> set = Loaded();
    const std::vector<RestoredShard>& shards = set->shards;
    const int n = static_cast<int>(shards.size());
    // Each id to its home shard (the files' map), remembering its positions.
    const ShardMap& map = shards[0].store->map();
    const ShardMap::TableKey key = ShardMap::KeyOf(table);
    std::vector<PullRequest> requests(n);
    std::vector<std::vector<size_t>> positions(n);
    for (size_t i = 0; i < ids.size(); ++i) {
      const int home = map.RowHome(key, ids[i]);
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
      absl::Status st = shards[s].store->tables().Pull(
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
    const std::shared_ptr<const RestoredSet> set = Loaded();
    const std::vector<RestoredShard>& shards = set->shards;
    absl::flat_hash_map<std::string, std::pair<float*, int64_t>> targets;
    for (const TensorSpec& spec : shards[0].store->ListTensors()) {
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
    for (const RestoredShard& shard : shards) {
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

  std::string Describe() const override { return Loaded()->description; }

 private:
  std::shared_ptr<const RestoredSet> Loaded() const {
    absl::MutexLock l(&mu_);
    return loaded_;
  }

  // The set to serve: restored again if the directory's files changed.
  absl::StatusOr<std::shared_ptr<const RestoredSet>> Follow() {
    absl::StatusOr<ShardFileSet> files = FindShardFileSet(dir_, fs_);
    if (!files.ok()) return files.status();
    absl::StatusOr<std::vector<FileStamp>> stamps = Stamps(*files, fs_);
    if (!stamps.ok()) return stamps.status();
    {
      absl::MutexLock l(&mu_);
      if (*stamps == stamps_) return loaded_;
    }
    absl::StatusOr<std::shared_ptr<const RestoredSet>> set =
        RestoreSet(*files, fs_);
    if (!set.ok()) return set.status();
    absl::Status same = SameShapes(*Loaded(), **set);
    if (!same.ok()) return same;
    absl::MutexLock l(&mu_);
    stamps_ = *std::move(stamps);
    loaded_ = *set;
    return *std::move(set);
  }

  const std::string dir_;
  FileSystem* const fs_;  // not owned
  mutable absl::Mutex mu_;
  std::vector<FileStamp> stamps_ ABSL_GUARDED_BY(mu_);
  // Read only once loaded (ShardStore::Pull is thread-safe).
  std::shared_ptr<const RestoredSet> loaded_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<ParameterSource>> MakeCheckpointSource(
    const CheckpointSourceOptions& options) {
  if (options.dir.empty() || options.fs == nullptr) {
    return absl::InvalidArgumentError(
        "CheckpointSourceOptions.dir and fs are required");
  }
  FileSystem* const fs = options.fs;
  absl::StatusOr<ShardFileSet> files = FindShardFileSet(options.dir, fs);
  if (!files.ok()) return files.status();
  absl::StatusOr<std::vector<FileStamp>> stamps = Stamps(*files, fs);
  if (!stamps.ok()) return stamps.status();
  absl::StatusOr<std::shared_ptr<const RestoredSet>> set =
      RestoreSet(*files, fs);
  if (!set.ok()) return set.status();
  return std::unique_ptr<ParameterSource>(new CheckpointSource(
      options.dir, fs, *std::move(stamps), *std::move(set)));
}

}  // namespace asyncps
