#include "server/checkpoint_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/record_file.h"

namespace asyncps {
namespace {

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::Status(
      absl::ErrnoToStatusCode(errno),
      absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

// The process id the holder wrote, or "" when it cannot be read.
std::string HolderOf(int fd) {
  char buf[32] = {};
  const ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return "";
  return std::string(absl::StripAsciiWhitespace(absl::string_view(buf, n)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CheckpointLock>> CheckpointLock::Acquire(
    const std::string& dir, int shard_index, int num_shards,
    const Options& options) {
  spdlog::logger* const logger = options.logger;
  const bool create = options.create;
  if (create) {
    std::error_code made;
    std::filesystem::create_directories(dir, made);
    if (made) {
      return absl::Status(
          absl::ErrnoToStatusCode(made.value()),
          absl::StrCat("cannot create directory ", dir, ": ", made.message()));
    }
  }
  const std::string path = ShardFilePath(dir, shard_index, num_shards, "lock");
  const int fd =
      open(path.c_str(), O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0644);
  if (fd < 0 && !create && errno == ENOENT) {
    return std::unique_ptr<CheckpointLock>();  // no process ever locked it
  }
  if (fd < 0) return Errno("cannot open", path);
  const absl::Time deadline = absl::Now() + options.wait;
  bool said = false;
  while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == ENOLCK || errno == EOPNOTSUPP || errno == ENOSYS ||
        errno == EINVAL) {
      // A file system without locks (some network file systems): the
      // shard runs, unguarded.
      if (logger != nullptr) {
        logger->warn(
            "cannot lock {}: {}; nothing keeps another process of shard {} "
            "off these files",
            path, std::strerror(errno), shard_index);
      }
      break;
    }
    if (errno != EWOULDBLOCK && errno != EINTR) {
      const absl::Status s = Errno("cannot lock", path);
      close(fd);
      return s;
    }
    const std::string holder = HolderOf(fd);
    const std::string who =
        holder.empty() ? "another process" : absl::StrCat("process ", holder);
    if (absl::Now() >= deadline) {
      close(fd);
      return absl::FailedPreconditionError(absl::StrCat(
          "the files of shard ", shard_index, " of ", num_shards, " in ", dir,
          " are in use by ", who, " (", path, " is locked)", options.if_held));
    }
    if (!said && logger != nullptr) {
      logger->warn("waiting up to {} for {} to let go of {}",
                   absl::FormatDuration(options.wait), who, path);
      said = true;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  // The process id only names the holder to a process that waits; the
  // lock holds without it (a full disk must not keep a shard that can
  // restore its checkpoint from starting).
  const std::string pid = absl::StrCat(getpid(), "\n");
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid.data(), pid.size(), 0) !=
                                   static_cast<ssize_t>(pid.size())) {
    if (logger != nullptr) {
      logger->warn("cannot write this process's id into {}: {}", path,
                   std::strerror(errno));
    }
  }
  return std::unique_ptr<CheckpointLock>(new CheckpointLock(fd));
}

CheckpointLock::~CheckpointLock() { close(fd_); }

}  // namespace asyncps
