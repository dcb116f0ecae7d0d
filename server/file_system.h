#ifndef ASYNCPS_SERVER_FILE_SYSTEM_H_
#define ASYNCPS_SERVER_FILE_SYSTEM_H_

// The file operations durable state is written with (record files:
// checkpoints and spec files), behind an interface in the spirit of
// leveldb's Env, so that tests can make any of them fail or stop (a
// crash) and check what survives. FileSystem::Default() is POSIX.

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace asyncps {

// A file being written. Not thread-safe.
class WritableFile {
 public:
  virtual ~WritableFile() = default;  // closes without syncing
  // Appends all of `data` (or fails, naming the file).
  virtual absl::Status Append(absl::string_view data) = 0;
  // fsync: what was appended is durable.
  virtual absl::Status Sync() = 0;
  virtual absl::Status Close() = 0;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // Creates (or truncates) `path` for writing.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) = 0;
  // rename(2): atomically replaces `to`.
  virtual absl::Status Rename(const std::string& from,
                              const std::string& to) = 0;
  virtual absl::Status Remove(const std::string& path) = 0;
  // fsync of a directory: a rename or removal in it is durable.
  virtual absl::Status SyncDir(const std::string& dir) = 0;

  // The process's POSIX file system; never null, never deleted.
  static FileSystem* Default();
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_FILE_SYSTEM_H_
