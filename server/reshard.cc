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
#include "common/sharding.h"
#include "common/tensor_layout.h"
#include "common/version.h"
#include "server/checkpoint.h"
#include "server/checkpoint_dir.h"
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

}  // namespace

absl::StatusOr<ReshardReport> Reshard(const ReshardOptions& options) {
  const std::string& from_dir = options.from_dir;
  const std::string& to_dir = options.to_dir;
  const int num_shards = options.num_shards;
  FileSystem* const fs = options.fs;
  if (fs == nullptr) {
    return absl::InvalidArgumentError("ReshardOptions.fs is required");
  }
  if (num_shards < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the new shard count must be >= 1, got ", num_shards));
  }
  if (from_dir.empty() || to_dir.empty() || from_dir == to_dir) {
    return absl::InvalidArgumentError(
        "reshard needs a source directory and another, new target directory");
  }
  absl::StatusOr<ShardFileSet> set = FindShardFileSet(from_dir, fs);
  if (!set.ok()) return set.status();
  const int n = set->num_shards;
  absl::StatusOr<std::vector<ShardFile>> existing = ListShardFiles(to_dir, fs);
  if (!existing.ok()) return existing.status();
  if (!existing->empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        to_dir, " already holds shard files (", (*existing)[0].path,
        ", ...): reshard into a new directory"));
  }

  ReshardReport report;
  report.from_shards = n;
  report.to_shards = num_shards;
  std::vector<std::unique_ptr<ShardStore>> fresh;
  for (int j = 0; j < num_shards; ++j) {
    ShardStoreOptions o;
    o.shard_index = j;
    o.num_shards = num_shards;
    absl::StatusOr<std::unique_ptr<ShardStore>> store = ShardStore::Create(o);
    if (!store.ok()) return store.status();
    fresh.push_back(*std::move(store));
  }
  std::optional<std::string> run;
  auto same_run = [&](const std::string& id,
                      const std::string& path) -> absl::Status {
    if (!run.has_value()) run = id;
    if (*run == id) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(path, " belongs to run '", id, "', other files to run '",
                     *run, "': reshard one run's files"));
  };
  std::map<int32_t, std::vector<CheckpointWorker>> workers;
  // The specs every old shard must hold, and how many slices of each
  // tensor were copied (each exactly once over all old shards).
  std::vector<TensorSpec> tensor_specs;
  std::vector<TableSpec> table_specs;
  absl::flat_hash_map<std::string, int64_t> copied;

  for (int i = 0; i < n; ++i) {
    absl::StatusOr<RestoredShard> restored = RestoreShard(*set, i, fs);
    if (!restored.ok()) return restored.status();
    ShardStore& old = *restored->store;
    absl::Status same = same_run(restored->run_id, set->checkpoints[i].empty()
                                                       ? set->spec_files[i]
                                                       : set->checkpoints[i]);
    if (!same.ok()) return same;
    for (CheckpointWorker& w : restored->workers) {
      workers[w.worker_id()].push_back(std::move(w));
    }
    std::vector<TensorSpec> held = old.ListTensors();
    std::sort(held.begin(), held.end(),
              [](const TensorSpec& a, const TensorSpec& b) {
                return a.name() < b.name();
              });
    std::vector<TableSpec> held_tables = old.tables().List();
    if (i == 0) {
      tensor_specs = held;
      table_specs = held_tables;
      for (auto& store : fresh) {
        for (const TensorSpec& spec : tensor_specs) {
          absl::Status s = store->RestoreTensor(spec);
          if (!s.ok()) return s;
        }
        for (const TableSpec& spec : table_specs) {
          absl::Status s = store->tables().RestoreTable(spec);
          if (!s.ok()) return s;
        }
      }
    } else {
      auto names = [](const auto& list) {
        std::vector<std::string> out;
        for (const auto& spec : list) out.push_back(spec.name());
        return absl::StrJoin(out, ", ");
      };
      if (names(held) != names(tensor_specs) ||
          names(held_tables) != names(table_specs)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "shard ", i, " holds tensors [", names(held), "] and tables [",
            names(held_tables), "], shard 0 [", names(tensor_specs), "] and [",
            names(table_specs), "]: the files are not one consistent set"));
      }
    }

    std::string tensor;
    absl::Status s = old.Export(
        [&](const TensorSpec& spec) {
          tensor = spec.name();
          return absl::OkStatus();
        },
        [&](const ShardStore::SliceView& v) {
          std::vector<absl::string_view> state;
          for (absl::Span<const float> b : v.optimizer_state) {
            state.push_back(Bytes(b.data(), b.size()));
          }
          ++copied[tensor];
          ++report.slices;
          return fresh[SliceHome(tensor, v.index, num_shards)]->RestoreSlice(
              tensor, v.index, v.version,
              Bytes(v.values.data(), v.values.size()), state);
        });
    if (!s.ok()) return s;

    std::string table;
    uint64_t key = 0;
    std::vector<RowBatch> batches(num_shards);
    auto flush_all = [&]() -> absl::Status {
      for (int j = 0; j < num_shards; ++j) {
        absl::Status f = FlushRows(table, &batches[j], fresh[j].get());
        if (!f.ok()) return f;
      }
      return absl::OkStatus();
    };
    s = old.tables().Export(
        [&](const TableSpec& spec) {
          absl::Status f = flush_all();
          table = spec.name();
          key = RowTableKey(table);
          return f;
        },
        [&](const SparseTable::RowView& r) {
          const int j = RowHomeOf(key, r.id, num_shards);
          RowBatch& b = batches[j];
          b.ids.push_back(r.id);
          b.versions.push_back(r.version);
          b.touched.push_back(r.touched);
          absl::StrAppend(&b.values, Bytes(r.values, r.dim));
          absl::StrAppend(&b.state, Bytes(r.state, r.state_floats));
          ++report.rows;
          return b.ids.size() >= kRowBatch
                     ? FlushRows(table, &b, fresh[j].get())
                     : absl::OkStatus();
        });
    if (s.ok()) s = flush_all();
    if (!s.ok()) return s;
  }

  for (const TensorSpec& spec : tensor_specs) {
    const int64_t slices = TensorLayout::FromSpec(spec)->num_slices();
    if (copied[spec.name()] != slices) {
      return absl::DataLossError(
          absl::StrCat("tensor ", QuoteName(spec.name()), " has ", slices,
                       " slices; the old shards held ", copied[spec.name()]));
    }
  }

  std::vector<CheckpointWorker> merged;
  for (const auto& [id, records] : workers) {
    merged.push_back(MergeWorker(records));
  }
  absl::Status s = fs->CreateDirs(to_dir);
  if (!s.ok()) return s;
  report.run_id = run.value_or("");
  report.tensors = static_cast<int>(tensor_specs.size());
  report.tables = static_cast<int>(table_specs.size());
  report.workers = static_cast<int>(merged.size());
  for (int j = 0; j < num_shards; ++j) {
    CheckpointImage image = CaptureCheckpoint(*fresh[j], merged, absl::Now(),
                                              kVersion, report.run_id);
    absl::StatusOr<CheckpointInfo> written =
        WriteCheckpoint(image, to_dir, Clock::Real(), fs);
    if (!written.ok()) return written.status();
    report.written.push_back(written->path());
    SpecFileContents contents;
    contents.identity.set_shard_index(j);
    contents.identity.set_num_shards(num_shards);
    contents.identity.set_unix_time_ms(absl::ToUnixMillis(absl::Now()));
    contents.identity.set_build_version(kVersion);
    contents.identity.set_run_id(report.run_id);
    contents.tensors = tensor_specs;
    contents.tables = table_specs;
    const std::string path = SpecFilePath(to_dir, j, num_shards);
    s = WriteSpecFile(path, contents, fs);
    if (!s.ok()) return s;
    report.written.push_back(path);
  }
  return report;
}

}  // namespace asyncps
