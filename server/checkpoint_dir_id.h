#ifndef ASYNCPS_SERVER_CHECKPOINT_DIR_ID_H_
#define ASYNCPS_SERVER_CHECKPOINT_DIR_ID_H_

// The name a checkpoint directory goes by in a replicated run's map
// (ReplicaRecord.checkpoint_id): a random id kept in the directory, so
// that a process restarted on it (at any address, on any host) is known as
// the replica whose checkpoints it holds. When every replica of a group is
// lost, the caught-up ones its record lists held the group's last state;
// a process whose directory is none of theirs has an older checkpoint and
// leaves the claim to one of them (server/replica_group.h).
//
// Example:
//
//   absl::StatusOr<std::string> id = CheckpointDirId(dir, fs);
//   if (!id.ok()) return id.status();  // unreadable or unwritable, named
//   options.checkpoint_id = *id;

#include <string>

#include "absl/status/statusor.h"
#include "server/file_system.h"

namespace asyncps {

// The file under `dir` that holds its id.
std::string CheckpointDirIdPath(const std::string& dir);

// The id of checkpoint directory `dir` (created, with the directory, the
// first time: a record file, server/record_file.h, written atomically and
// synced), through `fs` (nullptr = FileSystem::Default()). Errors name the
// file: DATA_LOSS for a corrupt one (removing it gives the directory a new
// id), others by errno.
absl::StatusOr<std::string> CheckpointDirId(const std::string& dir,
                                            FileSystem* fs = nullptr);

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_CHECKPOINT_DIR_ID_H_
