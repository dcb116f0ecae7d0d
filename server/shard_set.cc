#include "server/shard_set.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/checkpoint.h"
#include "server/checkpoint_dir.h"
#include "server/spec_file.h"
#include "server/starting_map.h"

namespace asyncps {

absl::StatusOr<ShardFileSet> FindShardFileSet(const std::string& dir,
                                              FileSystem* fs) {
  absl::StatusOr<std::vector<ShardFile>> files = ListShardFiles(dir, fs);
  if (!files.ok()) return files.status();
  if (files->empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no shard checkpoints or spec files in ", dir));
  }
  ShardFileSet set;
  set.dir = dir;
  set.num_shards = (*files)[0].num_shards;
  set.checkpoints.resize(set.num_shards);
  set.spec_files.resize(set.num_shards);
  set.deltas.resize(set.num_shards);
  for (const ShardFile& f : *files) {
    if (f.num_shards != set.num_shards) {
      return absl::FailedPreconditionError(absl::StrCat(
          dir, " mixes files of ", set.num_shards, " and ", f.num_shards,
          " shards (", f.path, "): use one consistent set"));
    }
    if (f.delta_sequence > 0) continue;
    (f.spec_file ? set.spec_files : set.checkpoints)[f.shard_index] = f.path;
  }
  for (int i = 0; i < set.num_shards; ++i) {
    set.deltas[i] = DeltaFilesOf(*files, i, set.num_shards);
  }
  for (int i = 0; i < set.num_shards; ++i) {
    if (set.checkpoints[i].empty() && set.spec_files[i].empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          dir, " has no checkpoint or spec file of shard ", i, " of ",
          set.num_shards, ": every shard's files are needed"));
    }
  }
  return set;
}

std::vector<std::string> AllFiles(const ShardFileSet& set) {
  std::vector<std::string> paths;
  for (int i = 0; i < set.num_shards; ++i) {
    for (const std::string* p : {&set.checkpoints[i], &set.spec_files[i]}) {
      if (!p->empty()) paths.push_back(*p);
    }
    if (i < static_cast<int>(set.deltas.size())) {
      paths.insert(paths.end(), set.deltas[i].begin(), set.deltas[i].end());
    }
  }
  return paths;
}

absl::StatusOr<RestoredShard> RestoreShard(const ShardFileSet& set, int index,
                                           FileSystem* fs) {
  ShardStoreOptions o;
  o.shard_index = index;
  o.num_shards = set.num_shards;
  // The map the files were written under (static unless they name one).
  absl::StatusOr<ShardMap> map = StartingShardMap(
      {set.dir, /*restore=*/true, index, set.num_shards, /*num_slots=*/0, fs});
  if (!map.ok()) return map.status();
  o.map = *map;
  absl::StatusOr<std::unique_ptr<ShardStore>> made = ShardStore::Create(o);
  if (!made.ok()) return made.status();
  RestoredShard shard;
  shard.store = *std::move(made);
  const std::string& ckpt = set.checkpoints[index];
  const std::string& specs = set.spec_files[index];
  if (!ckpt.empty()) {
    RestoreCheckpointOptions options;
    options.fs = fs;
    if (index < static_cast<int>(set.deltas.size())) {
      options.deltas = set.deltas[index];
    }
    absl::StatusOr<RestoredCheckpoint> r =
        RestoreCheckpoint(ckpt, shard.store.get(), options);
    if (!r.ok()) return r.status();
    shard.run_id = r->identity.run_id();
    shard.workers = std::move(r->workers);
  }
  if (!specs.empty()) {
    absl::StatusOr<SpecFileContents> c = ReadSpecFile(specs, fs);
    if (!c.ok()) return c.status();
    if (!ckpt.empty() && c->identity.run_id() != shard.run_id) {
      return absl::FailedPreconditionError(absl::StrCat(
          specs, " belongs to run '", c->identity.run_id(), "', ", ckpt,
          " to run '", shard.run_id, "': use one run's files"));
    }
    shard.run_id = c->identity.run_id();
    absl::StatusOr<int> created = ApplySpecFile(*c, specs, shard.store.get());
    if (!created.ok()) return created.status();
  }
  return shard;
}

}  // namespace asyncps
