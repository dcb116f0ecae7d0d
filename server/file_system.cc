#include "server/file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"

namespace asyncps {
namespace {

absl::Status IoError(int err, absl::string_view what, absl::string_view path) {
  return absl::ErrnoToStatus(err, absl::StrCat(what, " ", path));
}

class PosixWritableFile : public WritableFile {
 public:
  PosixWritableFile(int fd, std::string path)
      : fd_(fd), path_(std::move(path)) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  absl::Status Append(absl::string_view data) override {
    while (!data.empty()) {
      const ssize_t n = ::write(fd_, data.data(), data.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return IoError(errno, "write", path_);
      }
      data.remove_prefix(static_cast<size_t>(n));
    }
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    if (::fsync(fd_) != 0) return IoError(errno, "fsync", path_);
    return absl::OkStatus();
  }

  absl::Status Close() override {
    const int fd = fd_;
    fd_ = -1;
    if (fd >= 0 && ::close(fd) != 0) return IoError(errno, "close", path_);
    return absl::OkStatus();
  }

 private:
  int fd_;
  const std::string path_;
};

class PosixSequentialFile : public SequentialFile {
 public:
  PosixSequentialFile(int fd, std::string path, uint64_t size)
      : fd_(fd), path_(std::move(path)), size_(size) {}
  ~PosixSequentialFile() override { ::close(fd_); }

  absl::StatusOr<size_t> Read(char* dst, size_t n) override {
    size_t done = 0;
    while (done < n) {
      const ssize_t r = ::read(fd_, dst + done, n - done);
      if (r < 0) {
        if (errno == EINTR) continue;
        return IoError(errno, "read", path_);
      }
      if (r == 0) break;  // end of file
      done += static_cast<size_t>(r);
    }
    return done;
  }

  uint64_t size() const override { return size_; }

 private:
  const int fd_;
  const std::string path_;
  const uint64_t size_;
};

FileStat StatOf(const struct stat& st) {
  FileStat out;
  out.size = static_cast<uint64_t>(st.st_size);
  out.modified_ns =
      int64_t{st.st_mtim.tv_sec} * 1000000000 + int64_t{st.st_mtim.tv_nsec};
  out.inode = static_cast<uint64_t>(st.st_ino);
  return out;
}

class PosixFileSystem : public FileSystem {
 public:
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) override {
    const int fd =
        ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return IoError(errno, "create", path);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(fd, path));
  }

  absl::Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return IoError(errno, absl::StrCat("rename ", from, " to"), to);
    }
    return absl::OkStatus();
  }

  absl::Status Remove(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return IoError(errno, "remove", path);
    return absl::OkStatus();
  }

  absl::Status SyncDir(const std::string& dir) override {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return IoError(errno, "open directory", dir);
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) return IoError(err, "fsync directory", dir);
    return absl::OkStatus();
  }

  absl::Status CreateDirs(const std::string& dir) override {
    if (dir.empty()) return absl::InvalidArgumentError("mkdir: empty path");
    // Every prefix ending before a '/', then the whole path.
    for (size_t at = dir.find('/', 1);; at = dir.find('/', at + 1)) {
      const std::string prefix = dir.substr(0, at);
      if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
        return IoError(errno, "mkdir", prefix);
      }
      if (at == std::string::npos) break;
    }
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0) return IoError(errno, "stat", dir);
    if (!S_ISDIR(st.st_mode)) return IoError(ENOTDIR, "mkdir", dir);
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<SequentialFile>> NewSequentialFile(
      const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return IoError(errno, "open", path);
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      return IoError(err, "stat", path);
    }
    if (S_ISDIR(st.st_mode)) {
      ::close(fd);
      return IoError(EISDIR, "open", path);
    }
    return std::unique_ptr<SequentialFile>(
        new PosixSequentialFile(fd, path, static_cast<uint64_t>(st.st_size)));
  }

  absl::StatusOr<std::vector<std::string>> GetChildren(
      const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return IoError(errno, "open directory", dir);
    std::vector<std::string> names;
    while (true) {
      errno = 0;
      const dirent* e = ::readdir(d);
      if (e == nullptr) break;
      const absl::string_view name = e->d_name;
      if (name == "." || name == "..") continue;
      names.emplace_back(name);
    }
    const int err = errno;
    ::closedir(d);
    if (err != 0) return IoError(err, "read directory", dir);
    return names;
  }

  absl::StatusOr<FileStat> Stat(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return IoError(errno, "stat", path);
    return StatOf(st);
  }
};

}  // namespace

FileSystem* FileSystem::Default() {
  static FileSystem* const fs = new PosixFileSystem();
  return fs;
}

}  // namespace asyncps
