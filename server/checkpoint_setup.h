#ifndef ASYNCPS_SERVER_CHECKPOINT_SETUP_H_
#define ASYNCPS_SERVER_CHECKPOINT_SETUP_H_

// ps_server's checkpoint flags (--checkpoint_dir, --checkpoint_every_s,
// --checkpoint_full_every, --checkpoint_delta_max_fraction, --restore,
// --checkpoint_lock_wait_s, --run_id, --adopt_run), defined here, and the
// lock a shard holds on its files in --checkpoint_dir while it runs
// (server/checkpoint_lock.h).

#include <memory>

#include "absl/status/status.h"
#include "server/checkpoint_lock.h"
#include "server/ps_server.h"

namespace asyncps {

// Checkpoints, restore and the run's identity, from the flags into `o`;
// the error names the flag.
absl::Status CheckpointFlags(PsServerOptions* o);

// The lock a server process holds on its shard's files in its
// --checkpoint_dir (server/checkpoint_lock.h): taken before it reads or
// writes any of them, held while it runs.
class ShardFilesLock {
 public:
  // Holds the lock of shard `shard` of o.store.num_shards in
  // o.checkpoint_dir (letting go of the one of another shard it held),
  // waiting --checkpoint_lock_wait_s for another process to let go (a
  // process restarted at once may find the one before still exiting). OK
  // at once when it holds that shard's, or without a directory.
  absl::Status Lock(const PsServerOptions& o, int shard);

 private:
  int shard_ = -1;
  std::unique_ptr<CheckpointLock> lock_;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_CHECKPOINT_SETUP_H_
