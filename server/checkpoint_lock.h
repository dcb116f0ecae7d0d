#ifndef ASYNCPS_SERVER_CHECKPOINT_LOCK_H_
#define ASYNCPS_SERVER_CHECKPOINT_LOCK_H_

// One process at a time on a shard's files in a checkpoint directory: two
// ps_server processes of one shard on one --checkpoint_dir (two replicas
// given the same directory, a shared volume mounted by every pod, a
// process started while the one before still runs) would write each
// other's checkpoints and spec files, and each would restore a state the
// other wrote. ps_server holds an exclusive lock (flock(2)) on
// <dir>/shard-<i>-of-<n>.lock while it runs; the kernel lets go of it
// when the process ends, however it ends. Shards of one run may share a
// directory (their files differ).
//
// Example:
//
//   absl::StatusOr<std::unique_ptr<CheckpointLock>> lock =
//       CheckpointLock::Acquire(dir, 0, 2, {absl::Seconds(10), logger.get()});
//   if (!lock.ok()) return lock.status();  // FAILED_PRECONDITION: in use
//   ... run the shard; the lock goes with *lock or the process ...

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "spdlog/spdlog.h"

namespace asyncps {

class CheckpointLock {
 public:
  struct Options {
    // How long a lock another process holds is waited for (one that is
    // exiting lets go within it).
    absl::Duration wait = absl::ZeroDuration();
    spdlog::logger* logger = nullptr;  // warnings; may be null
    // False: nothing is created (a reader of a stopped run's files); no
    // lock file means no process ever held the files, and the answer is a
    // null lock.
    bool create = true;
    // Appended to the message of a lock held by another process: what the
    // caller's user should do about it.
    std::string if_held;
  };

  // Locks the files of shard `shard_index` of `num_shards` in `dir`
  // (creating the directory and the lock file, which then holds this
  // process's id; when the id cannot be written, a full disk, that is said
  // to the logger and the lock holds all the same). A lock held by another
  // process is waited for up to `options.wait` (said once to the logger),
  // then FAILED_PRECONDITION naming the directory and the holder's process
  // id, then `options.if_held`. Other errors (naming the file) by errno; a
  // file system that has no locks (ENOLCK, EOPNOTSUPP) is said to the logger
  // and the shard runs unguarded.
  static absl::StatusOr<std::unique_ptr<CheckpointLock>> Acquire(
      const std::string& dir, int shard_index, int num_shards,
      const Options& options);
  ~CheckpointLock();  // lets go
  CheckpointLock(const CheckpointLock&) = delete;
  CheckpointLock& operator=(const CheckpointLock&) = delete;

 private:
  explicit CheckpointLock(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_CHECKPOINT_LOCK_H_
