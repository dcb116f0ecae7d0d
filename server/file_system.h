#ifndef ASYNCPS_SERVER_FILE_SYSTEM_H_
#define ASYNCPS_SERVER_FILE_SYSTEM_H_

// Every file operation on durable state (record files: checkpoints and spec
// files, and the directories that hold them), behind an interface in the
// spirit of leveldb's Env: writes (create, append, fsync, rename, remove,
// directory sync, mkdir) and reads (open and read front to back, stat, list
// a directory). Tests inject a FileSystem that fails or stops (a crash) at
// any of them and check what survives and what a restore reports.
//
// FileSystem::Default() is the process's POSIX file system. main() passes it
// to the libraries through their Options structs (PsServerOptions::fs,
// ReshardOptions::fs, CheckpointSourceOptions::fs, ...); a library never
// reaches for a file system of its own.
//
// Example:
//
//   FileSystem* fs = FileSystem::Default();
//   absl::StatusOr<std::unique_ptr<SequentialFile>> file =
//       fs->NewSequentialFile(path);
//   if (!file.ok()) return file.status();  // e.g. NOT_FOUND, naming path
//   char buffer[4096];
//   absl::StatusOr<size_t> n = (*file)->Read(buffer, sizeof(buffer));
//   // *n < sizeof(buffer) only at the end of the file.
//
// Errors are absl::Status values made from errno (absl::ErrnoToStatus: the
// code follows errno, e.g. ENOENT is NOT_FOUND), whose message names the
// operation and the path and ends with strerror's text, e.g.
// "open /ckpt/shard-0-of-2.ckpt: No such file or directory".

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

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

// A file being read front to back (leveldb's SequentialFile). Not
// thread-safe.
class SequentialFile {
 public:
  virtual ~SequentialFile() = default;  // closes
  // Reads up to `n` bytes into `dst` and returns how many it read: fewer
  // than n only at the end of the file (0 once there). Errors name the file.
  virtual absl::StatusOr<size_t> Read(char* dst, size_t n) = 0;
  // The file's size when it was opened (fstat of the open file, so that a
  // rename over its path meanwhile does not change it).
  virtual uint64_t size() const = 0;
};

// What stat(2) says of a file.
struct FileStat {
  uint64_t size = 0;
  int64_t modified_ns = 0;  // since the Unix epoch
  // The inode: replacing a file by a rename (how record files are written)
  // gives its path a new one.
  uint64_t inode = 0;
};

// Implementations are thread-safe; the files they return are not.
class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // ---- Writes.

  // Creates (or truncates) `path` for writing.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) = 0;
  // rename(2): atomically replaces `to`.
  virtual absl::Status Rename(const std::string& from,
                              const std::string& to) = 0;
  virtual absl::Status Remove(const std::string& path) = 0;
  // fsync of a directory: a rename or removal in it is durable.
  virtual absl::Status SyncDir(const std::string& dir) = 0;
  // Creates `dir` and its missing parents (mkdir -p); OK if it exists.
  virtual absl::Status CreateDirs(const std::string& dir) = 0;

  // ---- Reads.

  // Opens `path` for reading from its start: NOT_FOUND when there is no
  // such file, other errors by errno.
  virtual absl::StatusOr<std::unique_ptr<SequentialFile>> NewSequentialFile(
      const std::string& path) = 0;
  // The names of the entries of `dir` (without "." and ".."), in no
  // particular order: NOT_FOUND when there is no such directory, other
  // errors (e.g. PERMISSION_DENIED) by errno.
  virtual absl::StatusOr<std::vector<std::string>> GetChildren(
      const std::string& dir) = 0;
  // stat(2) of `path`: NOT_FOUND when there is none.
  virtual absl::StatusOr<FileStat> Stat(const std::string& path) = 0;

  // The process's POSIX file system; never null, never deleted.
  static FileSystem* Default();
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_FILE_SYSTEM_H_
