#include "server/checkpoint_setup.h"

#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/names.h"
#include "server/checkpoint_dir.h"

ABSL_FLAG(
    std::string, checkpoint_dir, "",
    "Directory for this shard's checkpoint file "
    "(shard-<i>-of-<n>.ckpt, and its deltas shard-<i>-of-<n>.delta-<k> "
    "with --checkpoint_full_every); empty = checkpoints off. Written on "
    "the Checkpoint RPC (psctl checkpoint), every --checkpoint_every_s and "
    "at SIGINT/SIGTERM shutdown.");
ABSL_FLAG(int64_t, checkpoint_every_s, 0,
          "With --checkpoint_dir: also write a checkpoint this many seconds "
          "after the previous one; 0 = only on request and at shutdown.");
ABSL_FLAG(int32_t, checkpoint_full_every, 1,
          "With --checkpoint_dir: incremental checkpoints. Every N-th "
          "checkpoint is a full one (shard-<i>-of-<n>.ckpt), the N-1 between "
          "are deltas (shard-<i>-of-<n>.delta-<k>) holding only the slices "
          "and rows changed (and rows evicted) since the previous one. 0 or "
          "1 = every checkpoint is full.");
ABSL_FLAG(double, checkpoint_delta_max_fraction, 0.5,
          "With --checkpoint_full_every > 1: write a full checkpoint instead "
          "of a delta once the deltas since the last full one add up to this "
          "fraction of its size (> 0).");
ABSL_FLAG(bool, restore, true,
          "With --checkpoint_dir: load this shard's checkpoint before "
          "serving when one exists; one that cannot be restored (corrupt, "
          "another shard's) stops the start. false = start empty (the next "
          "checkpoint replaces the file).");
ABSL_FLAG(int64_t, checkpoint_lock_wait_s, 30,
          "With --checkpoint_dir: how long a starting shard waits for "
          "another process to let go of this shard's files there (one "
          "started while the one before still exits, e.g. writing its final "
          "checkpoint) before it exits 2; >= 0. Every server process of a "
          "shard needs a --checkpoint_dir of its own.");
ABSL_FLAG(std::string, run_id, "",
          "The run this shard belongs to (letters, digits, ._:@/+-; at most "
          "128). Stored in its checkpoints and spec file; the shard restores "
          "only files of its own run (see --adopt_run) and refuses workers "
          "of another --run_id.");
ABSL_FLAG(std::string, adopt_run, "",
          "With --checkpoint_dir: also restore the files of this other run "
          "(any: of any run) as the start of this run: parameters, optimizer "
          "state and versions are kept, the other run's worker records are "
          "dropped (its workers' progress does not carry over).");

namespace asyncps {

absl::Status CheckpointFlags(PsServerOptions* o) {
  o->checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  const int64_t every = absl::GetFlag(FLAGS_checkpoint_every_s);
  if (every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--checkpoint_every_s must be >= 0, got ", every));
  }
  if (every > 0 && o->checkpoint_dir.empty()) {
    return absl::InvalidArgumentError(
        "--checkpoint_every_s needs --checkpoint_dir");
  }
  o->checkpoint_every = absl::Seconds(every);
  o->checkpoint_full_every = absl::GetFlag(FLAGS_checkpoint_full_every);
  if (o->checkpoint_full_every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--checkpoint_full_every must be >= 0, got ",
                     o->checkpoint_full_every));
  }
  o->checkpoint_delta_max_fraction =
      absl::GetFlag(FLAGS_checkpoint_delta_max_fraction);
  if (!(o->checkpoint_delta_max_fraction > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--checkpoint_delta_max_fraction must be > 0, got ",
                     o->checkpoint_delta_max_fraction));
  }
  o->restore = absl::GetFlag(FLAGS_restore);
  if (const int64_t wait = absl::GetFlag(FLAGS_checkpoint_lock_wait_s);
      wait < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--checkpoint_lock_wait_s must be >= 0, got ", wait));
  }
  o->run_id = absl::GetFlag(FLAGS_run_id);
  if (absl::Status r = CheckRunId(o->run_id); !r.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--run_id: ", r.message()));
  }
  o->adopt_run = absl::GetFlag(FLAGS_adopt_run);
  if (o->adopt_run != kAdoptAnyRun) {
    if (absl::Status r = CheckRunId(o->adopt_run); !r.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--adopt_run: ", r.message()));
    }
  }
  if (!o->adopt_run.empty() && o->checkpoint_dir.empty()) {
    return absl::InvalidArgumentError("--adopt_run needs --checkpoint_dir");
  }
  return absl::OkStatus();
}

absl::Status ShardFilesLock::Lock(const PsServerOptions& o, int shard) {
  if (o.checkpoint_dir.empty() || (lock_ != nullptr && shard_ == shard)) {
    return absl::OkStatus();
  }
  CheckpointLock::Options lock;
  lock.wait = absl::Seconds(absl::GetFlag(FLAGS_checkpoint_lock_wait_s));
  lock.logger = o.logger.get();
  lock.if_held =
      ": every server process of a shard needs a --checkpoint_dir of its own";
  absl::StatusOr<std::unique_ptr<CheckpointLock>> locked =
      CheckpointLock::Acquire(o.checkpoint_dir, shard, o.store.num_shards,
                              lock);
  if (!locked.ok()) return locked.status();
  lock_ = *std::move(locked);
  shard_ = shard;
  return absl::OkStatus();
}

}  // namespace asyncps
