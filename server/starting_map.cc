#include "server/starting_map.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "proto/checkpoint.pb.h"
#include "server/checkpoint.h"
#include "server/spec_file.h"

namespace asyncps {

namespace {

// The identity of the shard's files: its checkpoint's, else its spec
// file's; NOT_FOUND when it has neither.
absl::StatusOr<CheckpointIdentity> FilesIdentity(const StartingMapInputs& in) {
  absl::StatusOr<CheckpointIdentity> identity = ReadCheckpointIdentity(
      CheckpointPath(in.checkpoint_dir, in.shard_index, in.num_shards), in.fs);
  if (!absl::IsNotFound(identity.status())) return identity;
  absl::StatusOr<SpecFileContents> specs = ReadSpecFile(
      SpecFilePath(in.checkpoint_dir, in.shard_index, in.num_shards), in.fs);
  if (!specs.ok()) return specs.status();
  return specs->identity;
}

// The map of a run whose slots start on shards 0..serving_shards-1 only:
// a standby shard (index >= serving_shards) owns no slot until a move
// gives it some.
absl::StatusOr<ShardMap> ServingMap(const StartingMapInputs& in) {
  const int k = in.serving_shards;
  if (in.num_slots <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--serving_shards=", k,
                     " needs a slotted run: set --num_slots (e.g. 4096), or "
                     "--serving_shards=0"));
  }
  if (k < 1 || k > in.num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("--serving_shards must be 0 (all) or in [1, --num_shards=",
                     in.num_shards, "], got ", k));
  }
  if (in.num_slots < k || in.num_slots > ShardMap::kMaxSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("--num_slots must be in [--serving_shards=", k, ", ",
                     ShardMap::kMaxSlots, "], got ", in.num_slots));
  }
  std::vector<uint16_t> owners(static_cast<size_t>(in.num_slots));
  for (int s = 0; s < in.num_slots; ++s) {
    owners[s] = static_cast<uint16_t>(s % k);
  }
  return ShardMap::Slotted(in.num_shards, std::move(owners),
                           ShardMap::kStaticEpoch);
}

absl::StatusOr<ShardMap> FlagsMap(const StartingMapInputs& in) {
  if (in.serving_shards != 0) return ServingMap(in);
  if (in.num_slots == 0) return ShardMap::Static(in.num_shards);
  absl::StatusOr<ShardMap> map =
      ShardMap::EvenSlots(in.num_shards, in.num_slots);
  if (!map.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--num_slots: ", map.status().message()));
  }
  return map;
}

}  // namespace

absl::StatusOr<ShardMap> StartingShardMap(const StartingMapInputs& in) {
  absl::StatusOr<ShardMap> flags = FlagsMap(in);
  if (!flags.ok() || in.checkpoint_dir.empty() || !in.restore) return flags;
  absl::StatusOr<CheckpointIdentity> identity = FilesIdentity(in);
  if (absl::IsNotFound(identity.status())) return flags;
  if (!identity.ok()) return identity.status();
  absl::StatusOr<ShardMap> files = IdentityMap(*identity);
  if (!files.ok()) {
    return absl::DataLossError(absl::StrCat(
        "the shard map in the files of shard ", in.shard_index, " in ",
        in.checkpoint_dir, ": ", files.status().message()));
  }
  if (files->slotted()) {
    if (in.num_slots == 0 || in.num_slots == files->num_slots()) return files;
    return absl::FailedPreconditionError(absl::StrCat(
        "--num_slots=", in.num_slots, " but the files of shard ",
        in.shard_index, " in ", in.checkpoint_dir, " were written under the ",
        files->DebugString(), ": start with --num_slots=", files->num_slots(),
        " (or 0: the files' map), or psctl reshard them to another map"));
  }
  if (MapRestoresInto(*files, *flags)) return flags;
  return absl::FailedPreconditionError(absl::StrCat(
      "--num_slots=", in.num_slots, " would move keys of the static map of ",
      in.num_shards, " shards in ", in.checkpoint_dir,
      " (a static run becomes slotted in place only when --num_shards "
      "divides --num_slots): pick such a slot count, or psctl reshard the "
      "files with --slots"));
}

}  // namespace asyncps
