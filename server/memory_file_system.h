#ifndef ASYNCPS_SERVER_MEMORY_FILE_SYSTEM_H_
#define ASYNCPS_SERVER_MEMORY_FILE_SYSTEM_H_

// A FileSystem whose files live in memory: a record file (a checkpoint)
// written through it is its exact bytes, never touching a disk; a
// primary's snapshot for a spare goes this way (server/replica_feed.h).
// Directories are implicit.
//
// Example:
//   MemoryFileSystem mem;
//   WriteCheckpoint(image, "/snapshot", clock, &mem);
//   std::string bytes = mem.Take(CheckpointPath("/snapshot", 0, 1));

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/file_system.h"

namespace asyncps {

class MemoryFileSystem final : public FileSystem {
 public:
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status Remove(const std::string& path) override;
  absl::Status SyncDir(const std::string&) override { return absl::OkStatus(); }
  absl::Status CreateDirs(const std::string&) override {
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<SequentialFile>> NewSequentialFile(
      const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> GetChildren(
      const std::string& dir) override;
  absl::StatusOr<FileStat> Stat(const std::string& path) override;

  // Moves the file's bytes out ("" and nothing removed when there is none).
  std::string Take(const std::string& path);

 private:
  class File;
  void Store(const std::string& path, std::string bytes);

  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<std::string>> files_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_MEMORY_FILE_SYSTEM_H_
