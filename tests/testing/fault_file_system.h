#ifndef ASYNCPS_TESTS_TESTING_FAULT_FILE_SYSTEM_H_
#define ASYNCPS_TESTS_TESTING_FAULT_FILE_SYSTEM_H_

// A FileSystem (server/file_system.h) over the real one that counts its
// operations (create, append, sync, close, rename, remove, directory sync)
// and can fail or stop at the n-th:
//   kShortWrite  an append writes half its bytes, then fails (ENOSPC);
//   kFailSync    a file or directory sync fails (EIO); other operations
//                at that index fail as kFailOp;
//   kFailOp      the operation fails (EIO) without doing anything;
//   kCrash       the process "dies": this and every later operation do
//                nothing and fail, leaving the disk as it was (no cleanup).

#include <cerrno>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/file_system.h"

namespace asyncps {
namespace testing {

class FaultFileSystem : public FileSystem {
 public:
  enum class Fault { kNone, kShortWrite, kFailSync, kFailOp, kCrash };

  // Fails operation `at` (0-based, counted from now) with `fault`.
  void Arm(int at, Fault fault) {
    at_ = ops_ + at;
    fault_ = fault;
    crashed_ = false;
  }
  int ops() const { return ops_; }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) override {
    if (absl::Status s = Next("create " + path, false); !s.ok()) return s;
    absl::StatusOr<std::unique_ptr<WritableFile>> f =
        FileSystem::Default()->NewWritableFile(path);
    if (!f.ok()) return f;
    return std::unique_ptr<WritableFile>(new File(this, path, *std::move(f)));
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    if (absl::Status s = Next("rename " + from, false); !s.ok()) return s;
    return FileSystem::Default()->Rename(from, to);
  }
  absl::Status Remove(const std::string& path) override {
    if (absl::Status s = Next("remove " + path, false); !s.ok()) return s;
    return FileSystem::Default()->Remove(path);
  }
  absl::Status SyncDir(const std::string& dir) override {
    if (absl::Status s = Next("fsync directory " + dir, true); !s.ok()) {
      return s;
    }
    return FileSystem::Default()->SyncDir(dir);
  }

 private:
  class File : public WritableFile {
   public:
    File(FaultFileSystem* fs, std::string path,
         std::unique_ptr<WritableFile> real)
        : fs_(fs), path_(std::move(path)), real_(std::move(real)) {}
    absl::Status Append(absl::string_view data) override {
      const bool short_write = fs_->Due(Fault::kShortWrite);
      if (short_write) {
        real_->Append(data.substr(0, data.size() / 2)).IgnoreError();
        fs_->Count();
        return absl::ResourceExhaustedError("write " + path_ +
                                            ": No space left on device");
      }
      if (absl::Status s = fs_->Next("write " + path_, false); !s.ok()) {
        return s;
      }
      return real_->Append(data);
    }
    absl::Status Sync() override {
      if (absl::Status s = fs_->Next("fsync " + path_, true); !s.ok()) {
        return s;
      }
      return real_->Sync();
    }
    absl::Status Close() override {
      if (absl::Status s = fs_->Next("close " + path_, false); !s.ok()) {
        return s;
      }
      return real_->Close();
    }

   private:
    FaultFileSystem* const fs_;
    const std::string path_;
    std::unique_ptr<WritableFile> real_;
  };

  bool Due(Fault fault) const {
    return !crashed_ && ops_ == at_ && fault_ == fault;
  }
  void Count() { ++ops_; }
  // Counts an operation; its error when it is to fail.
  absl::Status Next(const std::string& what, bool is_sync) {
    const int op = ops_++;
    if (crashed_) return absl::AbortedError(what + ": the process crashed");
    if (op != at_) return absl::OkStatus();
    switch (fault_) {
      case Fault::kCrash:
        crashed_ = true;
        return absl::AbortedError(what + ": the process crashed");
      case Fault::kFailSync:
      case Fault::kFailOp:
      case Fault::kShortWrite:  // at an operation that is not a write
        return absl::ErrnoToStatus(EIO, what + (is_sync ? " (sync)" : ""));
      case Fault::kNone:
        return absl::OkStatus();
    }
    return absl::OkStatus();
  }

  int ops_ = 0;
  int at_ = -1;
  Fault fault_ = Fault::kNone;
  bool crashed_ = false;
};

}  // namespace testing
}  // namespace asyncps

#endif  // ASYNCPS_TESTS_TESTING_FAULT_FILE_SYSTEM_H_
