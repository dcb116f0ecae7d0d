#include "server/checkpoint_dir.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "proto/checkpoint.pb.h"
#include "server/checkpoint.h"
#include "server/spec_file.h"

namespace asyncps {
namespace {

// Parses "shard-<i>-of-<n>.ckpt" / ".specs" / ".delta-<k>"; false for
// other names.
bool ParseShardFileName(const std::string& name, ShardFile* out) {
  absl::string_view rest = name;
  if (!absl::ConsumePrefix(&rest, "shard-")) return false;
  const size_t delta = rest.rfind(".delta-");
  if (delta != absl::string_view::npos) {
    if (!absl::SimpleAtoi(rest.substr(delta + 7), &out->delta_sequence) ||
        out->delta_sequence == 0) {
      return false;
    }
    rest = rest.substr(0, delta);
  } else if (absl::ConsumeSuffix(&rest, ".ckpt")) {
    out->spec_file = false;
  } else if (absl::ConsumeSuffix(&rest, ".specs")) {
    out->spec_file = true;
  } else {
    return false;
  }
  const std::vector<absl::string_view> parts = absl::StrSplit(rest, "-of-");
  return parts.size() == 2 && absl::SimpleAtoi(parts[0], &out->shard_index) &&
         absl::SimpleAtoi(parts[1], &out->num_shards) &&
         out->shard_index >= 0 && out->num_shards > 0 &&
         out->shard_index < out->num_shards;
}

std::string RunName(const std::string& run) {
  return run.empty() ? "'' (no --run_id)" : absl::StrCat("'", run, "'");
}

}  // namespace

absl::StatusOr<std::vector<ShardFile>> ListShardFiles(const std::string& dir,
                                                      FileSystem* fs) {
  if (fs == nullptr) fs = FileSystem::Default();
  std::vector<ShardFile> files;
  absl::StatusOr<std::vector<std::string>> names = fs->GetChildren(dir);
  if (absl::IsNotFound(names.status())) return files;
  if (!names.ok()) return names.status();
  for (const std::string& name : *names) {
    ShardFile f;
    if (!ParseShardFileName(name, &f)) continue;
    f.path = absl::StrCat(dir, dir.back() == '/' ? "" : "/", name);
    files.push_back(std::move(f));
  }
  std::sort(
      files.begin(), files.end(),
      [](const ShardFile& a, const ShardFile& b) { return a.path < b.path; });
  return files;
}

std::vector<std::string> DeltaFilesOf(const std::vector<ShardFile>& files,
                                      int shard_index, int num_shards) {
  std::vector<const ShardFile*> deltas;
  for (const ShardFile& f : files) {
    if (f.delta_sequence > 0 && f.shard_index == shard_index &&
        f.num_shards == num_shards) {
      deltas.push_back(&f);
    }
  }
  std::sort(deltas.begin(), deltas.end(),
            [](const ShardFile* a, const ShardFile* b) {
              return a->delta_sequence < b->delta_sequence;
            });
  std::vector<std::string> paths;
  for (const ShardFile* f : deltas) paths.push_back(f->path);
  return paths;
}

absl::StatusOr<std::vector<std::string>> ListDeltaFiles(const std::string& dir,
                                                        int shard_index,
                                                        int num_shards,
                                                        FileSystem* fs) {
  absl::StatusOr<std::vector<ShardFile>> files = ListShardFiles(dir, fs);
  if (!files.ok()) return files.status();
  return DeltaFilesOf(*files, shard_index, num_shards);
}

absl::StatusOr<int> PruneDeltaFiles(const std::string& dir, int shard_index,
                                    int num_shards, FileSystem* fs) {
  absl::StatusOr<std::vector<std::string>> deltas =
      ListDeltaFiles(dir, shard_index, num_shards, fs);
  if (!deltas.ok()) return deltas.status();
  if (deltas->empty()) return 0;
  for (const std::string& path : *deltas) {
    absl::Status s = fs->Remove(path);
    if (!s.ok()) return s;
  }
  absl::Status s = fs->SyncDir(dir);
  if (!s.ok()) return s;
  return static_cast<int>(deltas->size());
}

absl::Status CheckCheckpointDir(const CheckpointDirUse& use) {
  if (use.dir.empty()) return absl::OkStatus();
  absl::StatusOr<std::vector<ShardFile>> files =
      ListShardFiles(use.dir, use.fs);
  if (!files.ok()) return files.status();
  std::vector<std::string> foreign;
  int other_count = 0;
  for (const ShardFile& f : *files) {
    if (f.num_shards == use.num_shards) continue;
    foreign.push_back(f.path);
    other_count = f.num_shards;
  }
  if (!foreign.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint directory ", use.dir, " holds files of a cluster of ",
        other_count, " shard(s): ", absl::StrJoin(foreign, ", "),
        "; this shard is one of ", use.num_shards,
        ". A model changes its shard count only through a reshard (psctl "
        "reshard --from ",
        use.dir, " --to NEW_DIR --shards ", use.num_shards,
        "); otherwise start with the old count, or use another "
        "--checkpoint_dir"));
  }
  if (!use.restore) return absl::OkStatus();
  for (const ShardFile& f : *files) {
    // A delta applies only on top of its own run's full checkpoint.
    if (f.shard_index != use.shard_index || f.delta_sequence > 0) continue;
    absl::StatusOr<CheckpointIdentity> identity;
    if (f.spec_file) {
      absl::StatusOr<std::string> first =
          ReadFirstRecord(f.path, kSpecFileFormat, use.fs);
      CheckpointRecord record;
      if (!first.ok()) {
        identity = first.status();
      } else if (!record.ParseFromString(*first) || !record.has_identity()) {
        identity = absl::DataLossError(absl::StrCat(
            "spec file ", f.path, ": the first record is not the identity"));
      } else {
        identity = record.identity();
      }
    } else {
      identity = ReadCheckpointIdentity(f.path, use.fs);
    }
    if (!identity.ok()) return identity.status();
    const std::string& run = identity->run_id();
    if (run == use.run_id || use.adopt_run == kAdoptAnyRun ||
        (!use.adopt_run.empty() && run == use.adopt_run)) {
      continue;
    }
    const std::string adopt = run.empty() ? kAdoptAnyRun : run;
    return absl::FailedPreconditionError(absl::StrCat(
        f.path, " belongs to run ", RunName(run), "; this shard is run ",
        RunName(use.run_id), ". To continue that run, start with --run_id=",
        run, "; to start this run from its parameters, add --adopt_run=", adopt,
        " (its worker records are dropped); to start empty, use another "
        "--checkpoint_dir or --restore=false (the files are overwritten)"));
  }
  return absl::OkStatus();
}

}  // namespace asyncps
