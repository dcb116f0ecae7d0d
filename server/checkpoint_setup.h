#ifndef ASYNCPS_SERVER_CHECKPOINT_SETUP_H_
#define ASYNCPS_SERVER_CHECKPOINT_SETUP_H_

// ps_server's checkpoint flags (--checkpoint_dir, --checkpoint_every_s,
// --checkpoint_full_every, --checkpoint_delta_max_fraction, --restore,
// --checkpoint_lock_wait_s, --run_id, --adopt_run), defined here, and the
// lock a shard holds on its files in --checkpoint_dir while it runs
// (server/checkpoint_lock.h).

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/checkpoint_lock.h"
#include "server/ps_server.h"

namespace asyncps {

// Checkpoints, restore and the run's identity, from the flags into `o`;
// the error names the flag.
absl::Status CheckpointFlags(PsServerOptions* o);

// Locks the files of shard o.store.shard_index in o.checkpoint_dir for as
// long as the lock lives, waiting --checkpoint_lock_wait_s for another
// process to let go (a process restarted at once may find the one before
// still exiting); null when there is nothing to lock (no directory, or a
// spare of any shard that has not joined a shard yet).
absl::StatusOr<std::unique_ptr<CheckpointLock>> LockShardFiles(
    const PsServerOptions& o);

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_CHECKPOINT_SETUP_H_
