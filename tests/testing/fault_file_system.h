#ifndef ASYNCPS_TESTS_TESTING_FAULT_FILE_SYSTEM_H_
#define ASYNCPS_TESTS_TESTING_FAULT_FILE_SYSTEM_H_

// A FileSystem (server/file_system.h) over the real one that counts its
// operations and fails some of them, as a disk, a full file system or
// another process would. Thread-safe (a shard's checkpoint thread and a
// test's thread may share one).
//
// Step faults: Arm(n, fault) fails the n-th operation from now, counting
// every operation (writes: create, append, sync, close, rename, remove,
// directory sync, mkdir; reads: open, read, stat, directory listing):
//   kShortWrite  an append writes half its bytes, then fails (ENOSPC);
//   kFailSync    a file or directory sync fails (EIO);
//   kShortRead   a read returns half the bytes asked for and the file ends
//                there (every later read returns 0): the file reads back
//                shorter than its size;
//   kFailOp      the operation fails (EIO) without doing anything;
//   kCrash       the process "dies": this and every later operation do
//                nothing and fail, leaving the disk as it was (no cleanup).
// A kShortWrite, kFailSync or kShortRead armed at an operation of another
// kind fails it as kFailOp.
//
// Path faults, each on one file or directory until ClearPathFaults():
//   TruncateReads(path, n)    reads of `path` end after its first n bytes,
//                             though its size says more;
//   FailReads(path)           reads of `path` fail (EIO); it opens and
//                             stats fine;
//   VanishAfterListing(path)  the next listing of its directory lists it,
//                             then it is gone, as if another process
//                             removed it: opening or stat'ing it fails
//                             (ENOENT) and later listings omit it;
//   FailListing(dir, errno)   listing `dir` fails (e.g. EACCES, EIO);
//   FillDisk()                every write of every file fails (ENOSPC)
//                             and writes nothing, as on a full disk.
// Path faults change nothing on disk: once cleared, the files read back as
// they were.
//
// Example:
//
//   testing::FaultFileSystem fs;
//   fs.FailReads(CheckpointPath(dir, 0, 1));
//   RestoreCheckpointOptions o;
//   o.fs = &fs;
//   absl::StatusOr<RestoredCheckpoint> r = RestoreCheckpoint(path, store, o);
//   // !r.ok(), and r.status().message() names the file.

#include <cerrno>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/file_system.h"

namespace asyncps {
namespace testing {

class FaultFileSystem : public FileSystem {
 public:
  enum class Fault {
    kNone,
    kShortWrite,
    kFailSync,
    kFailOp,
    kCrash,
    kShortRead
  };

  // Fails operation `at` (0-based, counted from now) with `fault`.
  void Arm(int at, Fault fault) {
    absl::MutexLock l(&mu_);
    at_ = ops_ + at;
    fault_ = fault;
    crashed_ = false;
  }
  // Operations so far (every kind).
  int ops() const {
    absl::MutexLock l(&mu_);
    return ops_;
  }
  // "open PATH", "read PATH", "stat PATH", "list DIR", "create PATH", ...:
  // every operation so far, in order (operation i is log()[i]).
  std::vector<std::string> log() const {
    absl::MutexLock l(&mu_);
    return log_;
  }

  void TruncateReads(const std::string& path, uint64_t bytes) {
    absl::MutexLock l(&mu_);
    truncated_[path] = bytes;
  }
  void FailReads(const std::string& path) {
    absl::MutexLock l(&mu_);
    failed_reads_.insert(path);
  }
  void VanishAfterListing(const std::string& path) {
    absl::MutexLock l(&mu_);
    vanishing_.insert(path);
  }
  void FailListing(const std::string& dir, int err = EIO) {
    absl::MutexLock l(&mu_);
    failed_listings_[dir] = err;
  }
  void FillDisk() {
    absl::MutexLock l(&mu_);
    disk_full_ = true;
  }
  void ClearPathFaults() {
    absl::MutexLock l(&mu_);
    disk_full_ = false;
    truncated_.clear();
    failed_reads_.clear();
    vanishing_.clear();
    vanished_.clear();
    failed_listings_.clear();
  }

  // ---- Writes.

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) override {
    if (absl::Status s = Next("create " + path, Kind::kOther); !s.ok()) {
      return s;
    }
    absl::StatusOr<std::unique_ptr<WritableFile>> f =
        FileSystem::Default()->NewWritableFile(path);
    if (!f.ok()) return f;
    return std::unique_ptr<WritableFile>(
        new OutFile(this, path, *std::move(f)));
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    if (absl::Status s = Next("rename " + from, Kind::kOther); !s.ok()) {
      return s;
    }
    return FileSystem::Default()->Rename(from, to);
  }
  absl::Status Remove(const std::string& path) override {
    if (absl::Status s = Next("remove " + path, Kind::kOther); !s.ok()) {
      return s;
    }
    return FileSystem::Default()->Remove(path);
  }
  absl::Status SyncDir(const std::string& dir) override {
    if (absl::Status s = Next("fsync directory " + dir, Kind::kSync); !s.ok()) {
      return s;
    }
    return FileSystem::Default()->SyncDir(dir);
  }
  absl::Status CreateDirs(const std::string& dir) override {
    if (absl::Status s = Next("mkdir " + dir, Kind::kOther); !s.ok()) {
      return s;
    }
    return FileSystem::Default()->CreateDirs(dir);
  }

  // ---- Reads.

  absl::StatusOr<std::unique_ptr<SequentialFile>> NewSequentialFile(
      const std::string& path) override {
    if (absl::Status s = Next("open " + path, Kind::kOther); !s.ok()) {
      return s;
    }
    if (Vanished(path)) return absl::ErrnoToStatus(ENOENT, "open " + path);
    absl::StatusOr<std::unique_ptr<SequentialFile>> f =
        FileSystem::Default()->NewSequentialFile(path);
    if (!f.ok()) return f;
    return std::unique_ptr<SequentialFile>(
        new InFile(this, path, *std::move(f)));
  }

  absl::StatusOr<std::vector<std::string>> GetChildren(
      const std::string& dir) override {
    if (absl::Status s = Next("list " + dir, Kind::kOther); !s.ok()) return s;
    {
      absl::MutexLock l(&mu_);
      auto it = failed_listings_.find(dir);
      if (it != failed_listings_.end()) {
        return absl::ErrnoToStatus(it->second, "open directory " + dir);
      }
    }
    absl::StatusOr<std::vector<std::string>> names =
        FileSystem::Default()->GetChildren(dir);
    if (!names.ok()) return names;
    absl::MutexLock l(&mu_);
    std::vector<std::string> listed;
    for (std::string& name : *names) {
      const std::string path = Join(dir, name);
      if (vanished_.contains(path)) continue;
      if (vanishing_.erase(path) > 0) vanished_.insert(path);
      listed.push_back(std::move(name));
    }
    return listed;
  }

  absl::StatusOr<FileStat> Stat(const std::string& path) override {
    if (absl::Status s = Next("stat " + path, Kind::kOther); !s.ok()) {
      return s;
    }
    if (Vanished(path)) return absl::ErrnoToStatus(ENOENT, "stat " + path);
    return FileSystem::Default()->Stat(path);
  }

 private:
  enum class Kind { kOther, kSync, kWrite, kRead };

  class OutFile : public WritableFile {
   public:
    OutFile(FaultFileSystem* fs, std::string path,
            std::unique_ptr<WritableFile> real)
        : fs_(fs), path_(std::move(path)), real_(std::move(real)) {}
    absl::Status Append(absl::string_view data) override {
      bool short_write = false;
      if (absl::Status s =
              fs_->Next("write " + path_, Kind::kWrite, &short_write);
          !s.ok()) {
        return s;
      }
      if (fs_->DiskFull()) {
        return absl::ResourceExhaustedError("write " + path_ +
                                            ": No space left on device");
      }
      if (short_write) {
        real_->Append(data.substr(0, data.size() / 2)).IgnoreError();
        return absl::ResourceExhaustedError("write " + path_ +
                                            ": No space left on device");
      }
      return real_->Append(data);
    }
    absl::Status Sync() override {
      if (absl::Status s = fs_->Next("fsync " + path_, Kind::kSync); !s.ok()) {
        return s;
      }
      return real_->Sync();
    }
    absl::Status Close() override {
      if (absl::Status s = fs_->Next("close " + path_, Kind::kOther); !s.ok()) {
        return s;
      }
      return real_->Close();
    }

   private:
    FaultFileSystem* const fs_;
    const std::string path_;
    std::unique_ptr<WritableFile> real_;
  };

  class InFile : public SequentialFile {
   public:
    InFile(FaultFileSystem* fs, std::string path,
           std::unique_ptr<SequentialFile> real)
        : fs_(fs), path_(std::move(path)), real_(std::move(real)) {}
    absl::StatusOr<size_t> Read(char* dst, size_t n) override {
      bool short_read = false;
      if (absl::Status s = fs_->Next("read " + path_, Kind::kRead, &short_read);
          !s.ok()) {
        return s;
      }
      if (fs_->ReadFails(path_)) {
        return absl::ErrnoToStatus(EIO, "read " + path_);
      }
      if (ended_) return 0;
      size_t allowed = n;
      if (short_read) {
        allowed = n / 2;
        ended_ = true;
      }
      const uint64_t limit = fs_->ReadLimit(path_);
      if (pos_ + allowed > limit) {
        allowed = limit > pos_ ? static_cast<size_t>(limit - pos_) : 0;
      }
      absl::StatusOr<size_t> got = real_->Read(dst, allowed);
      if (got.ok()) pos_ += *got;
      return got;
    }
    uint64_t size() const override { return real_->size(); }

   private:
    FaultFileSystem* const fs_;
    const std::string path_;
    std::unique_ptr<SequentialFile> real_;
    uint64_t pos_ = 0;
    bool ended_ = false;  // a short read ended it
  };

  static std::string Join(const std::string& dir, const std::string& name) {
    return absl::StrCat(dir, !dir.empty() && dir.back() == '/' ? "" : "/",
                        name);
  }

  bool Vanished(const std::string& path) const {
    absl::MutexLock l(&mu_);
    return vanished_.contains(path);
  }
  bool DiskFull() const {
    absl::MutexLock l(&mu_);
    return disk_full_;
  }
  bool ReadFails(const std::string& path) const {
    absl::MutexLock l(&mu_);
    return failed_reads_.contains(path);
  }
  uint64_t ReadLimit(const std::string& path) const {
    absl::MutexLock l(&mu_);
    auto it = truncated_.find(path);
    return it == truncated_.end() ? UINT64_MAX : it->second;
  }

  // Counts an operation; its error when it is to fail. A write or read
  // armed with kShortWrite / kShortRead is not failed here: *cut is set and
  // the caller does half of it.
  absl::Status Next(const std::string& what, Kind kind, bool* cut = nullptr) {
    absl::MutexLock l(&mu_);
    const int op = ops_++;
    log_.push_back(what);
    if (crashed_) return absl::AbortedError(what + ": the process crashed");
    if (op != at_) return absl::OkStatus();
    switch (fault_) {
      case Fault::kNone:
        return absl::OkStatus();
      case Fault::kCrash:
        crashed_ = true;
        return absl::AbortedError(what + ": the process crashed");
      case Fault::kShortWrite:
      case Fault::kShortRead:
        if (cut != nullptr &&
            kind ==
                (fault_ == Fault::kShortWrite ? Kind::kWrite : Kind::kRead)) {
          *cut = true;
          return absl::OkStatus();
        }
        break;
      case Fault::kFailSync:
      case Fault::kFailOp:
        break;
    }
    return absl::ErrnoToStatus(EIO,
                               what + (kind == Kind::kSync ? " (sync)" : ""));
  }

  mutable absl::Mutex mu_;
  int ops_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> log_ ABSL_GUARDED_BY(mu_);
  int at_ ABSL_GUARDED_BY(mu_) = -1;
  Fault fault_ ABSL_GUARDED_BY(mu_) = Fault::kNone;
  bool crashed_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<std::string, uint64_t> truncated_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> failed_reads_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> vanishing_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> vanished_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> failed_listings_ ABSL_GUARDED_BY(mu_);
  bool disk_full_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace testing
}  // namespace asyncps

#endif  // ASYNCPS_TESTS_TESTING_FAULT_FILE_SYSTEM_H_
