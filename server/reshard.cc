#include "server/reshard.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/names.h"
#include "common/shard_map.h"
#include "common/tensor_layout.h"
#include "common/version.h"
#include "server/checkpoint.h"
#include "server/checkpoint_dir.h"
#include "server/checkpoint_lock.h"
#include "server/shard_set.h"
#include "server/spec_file.h"
#include "store/shard_store.h"

namespace asyncps {
namespace {

// Replaced incarnations a merged worker record keeps (as the registry's
// default).
constexpr size_t kRetiredKept = 16;
// Rows per RestoreRows call.
constexpr size_t kRowBatch = 4096;

absl::string_view Bytes(const float* data, size_t n) {
  return absl::string_view(reinterpret_cast<const char*>(data),
                           n * sizeof(float));
}

// The old shards' records of one worker id as one: the incarnation that
// replaced the others (most restarts, then the furthest clock), the others
// retired, the furthest clock and data position, and a de-duplication
// window that settles every sequence number any shard saw of it.
CheckpointWorker MergeWorker(const std::vector<CheckpointWorker>& records) {
  const CheckpointWorker* best = &records[0];
  for (const CheckpointWorker& r : records) {
    if (r.restarts() > best->restarts() ||
        (r.restarts() == best->restarts() && r.clock() > best->clock())) {
      best = &r;
    }
  }
  CheckpointWorker out;
  out.set_worker_id(best->worker_id());
  out.set_incarnation(best->incarnation());
  std::vector<uint64_t> retired;
  absl::flat_hash_set<uint64_t> seen = {best->incarnation()};
  bool left = true;
  uint64_t settled = 0;
  for (const CheckpointWorker& r : records) {
    for (uint64_t inc : r.retired_incarnations()) {
      if (seen.insert(inc).second) retired.push_back(inc);
    }
    if (seen.insert(r.incarnation()).second) retired.push_back(r.incarnation());
    out.set_clock(std::max(out.clock(), r.clock()));
    out.set_trained(std::max(out.trained(), r.trained()));
    out.set_pushes(std::max(out.pushes(), r.pushes()));
    out.set_restarts(std::max(out.restarts(), r.restarts()));
    left = left && r.left();
    if (r.incarnation() == best->incarnation()) {
      settled = std::max(settled, r.dedup_base());
      for (uint64_t seq : r.dedup_applied()) settled = std::max(settled, seq);
    }
  }
  if (retired.size() > kRetiredKept) {
    retired.erase(retired.begin(), retired.end() - kRetiredKept);
  }
  for (uint64_t inc : retired) out.add_retired_incarnations(inc);
  out.set_left(left);
  out.set_dedup_base(settled);
  return out;
}

// Rows on their way to one new shard, for the table being copied.
struct RowBatch {
  std::vector<uint64_t> ids, versions;
  std::vector<int64_t> touched;
  std::string values, state;
};

absl::Status FlushRows(const std::string& table, RowBatch* b,
                       ShardStore* store) {
  if (b->ids.empty()) return absl::OkStatus();
  absl::Status s = store->tables().RestoreRows(table, b->ids, b->versions,
                                               b->touched, b->values, b->state);
  *b = RowBatch();
  return s;
}

// One reshard: the old shards' files read one at a time, every slice and
// row copied to the new shard the new map names, then the new files
// written. Nothing is written before every old file was read whole.
class Resharder {
 public:
  Resharder(const ReshardOptions& options, const ShardMap& map)
      : o_(options), map_(map) {}

  absl::StatusOr<ReshardReport> Run() {
    absl::StatusOr<ShardFileSet> set = FindShardFileSet(o_.from_dir, o_.fs);
    if (!set.ok()) return set.status();
    absl::StatusOr<std::vector<ShardFile>> existing =
        ListShardFiles(o_.to_dir, o_.fs);
    if (!existing.ok()) return existing.status();
    if (!existing->empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          o_.to_dir, " already holds shard files (", (*existing)[0].path,
          ", ...): reshard into a new directory"));
    }
    // No shard process may run on either side while the files are read
    // and written: a running shard's checkpoints are of other moments
    // than its peers', and one started on the new files would start
    // empty under them.
    for (int i = 0; i < set->num_shards; ++i) {
      absl::Status s = Lock(o_.from_dir, i, set->num_shards, false);
      if (!s.ok()) return s;
    }
    report_.from_shards = set->num_shards;
    report_.to_shards = map_.num_shards();
    for (int j = 0; j < map_.num_shards(); ++j) {
      ShardStoreOptions so;
      so.shard_index = j;
      so.num_shards = map_.num_shards();
      so.map = map_;
      absl::StatusOr<std::unique_ptr<ShardStore>> store =
          ShardStore::Create(so);
      if (!store.ok()) return store.status();
      fresh_.push_back(*std::move(store));
    }
    for (int i = 0; i < set->num_shards; ++i) {
      absl::Status s = CopyShard(*set, i);
      if (!s.ok()) return s;
    }
    absl::Status s = CheckCopied();
    for (int j = 0; s.ok() && j < map_.num_shards(); ++j) {
      s = Lock(o_.to_dir, j, map_.num_shards(), true);
    }
    if (s.ok()) s = Write();
    if (!s.ok()) return s;
    return report_;
  }

 private:
  // Holds the lock of shard i of n's files in `dir` (server/checkpoint_lock.h)
  // until the reshard ends; `create` false: only where a lock file exists.
  absl::Status Lock(const std::string& dir, int i, int n, bool create) {
    CheckpointLock::Options options;
    options.create = create;
    options.if_held =
        ": reshard works on a stopped run's files (stop its shards first)";
    absl::StatusOr<std::unique_ptr<CheckpointLock>> lock =
        CheckpointLock::Acquire(dir, i, n, options);
    if (!lock.ok()) return lock.status();
    if (*lock != nullptr) locks_.push_back(*std::move(lock));
    return absl::OkStatus();
  }

  // Reads old shard i and copies what it holds.
  absl::Status CopyShard(const ShardFileSet& set, int i) {
    absl::StatusOr<RestoredShard> restored = RestoreShard(set, i, o_.fs);
    if (!restored.ok()) return restored.status();
    if (!old_map_.has_value()) old_map_ = restored->store->map();
    if (restored->store->map() != *old_map_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the files of shard ", i, " in ", set.dir, " were written under the ",
          restored->store->map().DebugString(), ", those of shard 0 under the ",
          old_map_->DebugString(), ": reshard one run's files"));
    }
    absl::Status s = SameRun(restored->run_id, set.checkpoints[i].empty()
                                                   ? set.spec_files[i]
                                                   : set.checkpoints[i]);
    if (!s.ok()) return s;
    for (CheckpointWorker& w : restored->workers) {
      workers_[w.worker_id()].push_back(std::move(w));
    }
    ShardStore& old = *restored->store;
    s = AdoptSpecs(i, old);
    if (s.ok()) s = CopySlices(old);
    if (s.ok()) s = CopyRows(old);
    return s;
  }

  absl::Status SameRun(const std::string& id, const std::string& path) {
    if (!run_.has_value()) run_ = id;
    if (*run_ == id) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(path, " belongs to run '", id, "', other files to run '",
                     *run_, "': reshard one run's files"));
  }

  // The first old shard's specs are created on every new shard; every other
  // old shard must hold the same.
  absl::Status AdoptSpecs(int i, ShardStore& old) {
    std::vector<TensorSpec> held = old.ListTensors();
    std::sort(held.begin(), held.end(),
              [](const TensorSpec& a, const TensorSpec& b) {
                return a.name() < b.name();
              });
    std::vector<TableSpec> held_tables = old.tables().List();
    if (i == 0) {
      tensor_specs_ = held;
      table_specs_ = held_tables;
      for (auto& store : fresh_) {
        for (const TensorSpec& spec : tensor_specs_) {
          absl::Status s = store->RestoreTensor(spec);
          if (!s.ok()) return s;
        }
        for (const TableSpec& spec : table_specs_) {
          absl::Status s = store->tables().RestoreTable(spec);
          if (!s.ok()) return s;
        }
      }
      return absl::OkStatus();
    }
    auto names = [](const auto& list) {
      std::vector<std::string> out;
      for (const auto& spec : list) out.push_back(spec.name());
      return absl::StrJoin(out, ", ");
    };
    if (names(held) != names(tensor_specs_) ||
        names(held_tables) != names(table_specs_)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", i, " holds tensors [", names(held), "] and tables [",
          names(held_tables), "], shard 0 [", names(tensor_specs_), "] and [",
          names(table_specs_), "]: the files are not one consistent set"));
    }
    return absl::OkStatus();
  }

  absl::Status CopySlices(ShardStore& old) {
    std::string tensor;
    return old.Export(
        [&](const TensorSpec& spec) {
          tensor = spec.name();
          return absl::OkStatus();
        },
        [&](const ShardStore::SliceView& v) {
          std::vector<absl::string_view> state;
          for (absl::Span<const float> b : v.optimizer_state) {
            state.push_back(Bytes(b.data(), b.size()));
          }
          ++copied_[tensor];
          ++report_.slices;
          return fresh_[map_.SliceHome(tensor, v.index)]->RestoreSlice(
              tensor, v.index, v.version,
              Bytes(v.values.data(), v.values.size()), state);
        });
  }

  absl::Status CopyRows(ShardStore& old) {
    std::string table;
    ShardMap::TableKey key;
    std::vector<RowBatch> batches(map_.num_shards());
    auto flush_all = [&]() -> absl::Status {
      for (int j = 0; j < map_.num_shards(); ++j) {
        absl::Status f = FlushRows(table, &batches[j], fresh_[j].get());
        if (!f.ok()) return f;
      }
      return absl::OkStatus();
    };
    absl::Status s = old.tables().Export(
        [&](const TableSpec& spec) {
          absl::Status f = flush_all();
          table = spec.name();
          key = ShardMap::KeyOf(table);
          return f;
        },
        [&](const SparseTable::RowView& r) {
          const int j = map_.RowHome(key, r.id);
          RowBatch& b = batches[j];
          b.ids.push_back(r.id);
          b.versions.push_back(r.version);
          b.touched.push_back(r.touched);
          absl::StrAppend(&b.values, Bytes(r.values, r.dim));
          absl::StrAppend(&b.state, Bytes(r.state, r.state_floats));
          ++report_.rows;
          return b.ids.size() >= kRowBatch
                     ? FlushRows(table, &b, fresh_[j].get())
                     : absl::OkStatus();
        });
    if (s.ok()) s = flush_all();
    return s;
  }

  // Every slice of every tensor was copied exactly once.
  absl::Status CheckCopied() {
    for (const TensorSpec& spec : tensor_specs_) {
      const int64_t slices = TensorLayout::FromSpec(spec)->num_slices();
      if (copied_[spec.name()] != slices) {
        return absl::DataLossError(absl::StrCat(
            "tensor ", QuoteName(spec.name()), " has ", slices,
            " slices; the old shards held ", copied_[spec.name()]));
      }
    }
    return absl::OkStatus();
  }

  // The new checkpoints and spec files, with the workers' merged records.
  absl::Status Write() {
    std::vector<CheckpointWorker> merged;
    for (const auto& [id, records] : workers_) {
      merged.push_back(MergeWorker(records));
    }
    absl::Status s = o_.fs->CreateDirs(o_.to_dir);
    if (!s.ok()) return s;
    report_.run_id = run_.value_or("");
    report_.tensors = static_cast<int>(tensor_specs_.size());
    report_.tables = static_cast<int>(table_specs_.size());
    report_.workers = static_cast<int>(merged.size());
    for (int j = 0; j < map_.num_shards(); ++j) {
      CheckpointImage image = CaptureCheckpoint(*fresh_[j], merged, absl::Now(),
                                                kVersion, report_.run_id);
      absl::StatusOr<CheckpointInfo> written =
          WriteCheckpoint(image, o_.to_dir, Clock::Real(), o_.fs);
      if (!written.ok()) return written.status();
      report_.written.push_back(written->path());
      SpecFileContents contents;
      contents.identity.set_shard_index(j);
      contents.identity.set_num_shards(map_.num_shards());
      contents.identity.set_unix_time_ms(absl::ToUnixMillis(absl::Now()));
      contents.identity.set_build_version(kVersion);
      contents.identity.set_run_id(report_.run_id);
      SetIdentityMap(map_, &contents.identity);
      contents.tensors = tensor_specs_;
      contents.tables = table_specs_;
      const std::string path = SpecFilePath(o_.to_dir, j, map_.num_shards());
      s = WriteSpecFile(path, contents, o_.fs);
      if (!s.ok()) return s;
      report_.written.push_back(path);
    }
    return absl::OkStatus();
  }

  const ReshardOptions& o_;
  const ShardMap map_;               // the new shard count's
  std::optional<ShardMap> old_map_;  // the files', from shard 0
  ReshardReport report_;
  std::vector<std::unique_ptr<ShardStore>> fresh_;
  std::vector<std::unique_ptr<CheckpointLock>> locks_;  // both sides' files
  std::optional<std::string> run_;
  std::map<int32_t, std::vector<CheckpointWorker>> workers_;
  // The specs every old shard must hold, and how many slices of each
  // tensor were copied (each exactly once over all old shards).
  std::vector<TensorSpec> tensor_specs_;
  std::vector<TableSpec> table_specs_;
  absl::flat_hash_map<std::string, int64_t> copied_;
};

}  // namespace

absl::StatusOr<ReshardReport> Reshard(const ReshardOptions& options) {
  if (options.fs == nullptr) {
    return absl::InvalidArgumentError("ReshardOptions.fs is required");
  }
  if (options.num_shards < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the new shard count must be >= 1, got ", options.num_shards));
  }
  if (options.from_dir.empty() || options.to_dir.empty() ||
      options.from_dir == options.to_dir) {
    return absl::InvalidArgumentError(
        "reshard needs a source directory and another, new target directory");
  }
  absl::StatusOr<ShardMap> map =
      options.num_slots > 0
          ? ShardMap::EvenSlots(options.num_shards, options.num_slots)
          : ShardMap::Static(options.num_shards);
  if (options.map.has_value()) map = *options.map;
  if (!map.ok()) return map.status();
  if (map->num_shards() != options.num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("the new map (", map->DebugString(), ") is not one of ",
                     options.num_shards, " shards"));
  }
  return Resharder(options, *map).Run();
}

}  // namespace asyncps
