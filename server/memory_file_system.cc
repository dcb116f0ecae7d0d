#include "server/memory_file_system.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace asyncps {

// A file being written: its bytes become the path's when closed.
class MemoryFileSystem::File final : public WritableFile {
 public:
  File(MemoryFileSystem* fs, std::string path)
      : fs_(fs), path_(std::move(path)) {}
  absl::Status Append(absl::string_view data) override {
    bytes_.append(data.data(), data.size());
    return absl::OkStatus();
  }
  absl::Status Sync() override { return absl::OkStatus(); }
  absl::Status Close() override {
    fs_->Store(path_, std::move(bytes_));
    bytes_.clear();
    return absl::OkStatus();
  }

 private:
  MemoryFileSystem* const fs_;
  const std::string path_;
  std::string bytes_;
};

namespace {

class Reader final : public SequentialFile {
 public:
  explicit Reader(std::shared_ptr<std::string> bytes)
      : bytes_(std::move(bytes)) {}
  absl::StatusOr<size_t> Read(char* dst, size_t n) override {
    const size_t k = std::min(n, bytes_->size() - at_);
    std::memcpy(dst, bytes_->data() + at_, k);
    at_ += k;
    return k;
  }
  uint64_t size() const override { return bytes_->size(); }

 private:
  const std::shared_ptr<std::string> bytes_;
  size_t at_ = 0;
};

absl::Status NotFound(const std::string& path) {
  return absl::NotFoundError(absl::StrCat(path, ": no such file"));
}

}  // namespace

void MemoryFileSystem::Store(const std::string& path, std::string bytes) {
  absl::MutexLock l(&mu_);
  files_[path] = std::make_shared<std::string>(std::move(bytes));
}

absl::StatusOr<std::unique_ptr<WritableFile>> MemoryFileSystem::NewWritableFile(
    const std::string& path) {
  Store(path, "");
  return std::unique_ptr<WritableFile>(new File(this, path));
}

absl::Status MemoryFileSystem::Rename(const std::string& from,
                                      const std::string& to) {
  absl::MutexLock l(&mu_);
  auto it = files_.find(from);
  if (it == files_.end()) return NotFound(from);
  files_[to] = std::move(it->second);
  files_.erase(from);
  return absl::OkStatus();
}

absl::Status MemoryFileSystem::Remove(const std::string& path) {
  absl::MutexLock l(&mu_);
  return files_.erase(path) == 1 ? absl::OkStatus() : NotFound(path);
}

absl::StatusOr<std::unique_ptr<SequentialFile>>
MemoryFileSystem::NewSequentialFile(const std::string& path) {
  absl::MutexLock l(&mu_);
  auto it = files_.find(path);
  if (it == files_.end()) return NotFound(path);
  return std::unique_ptr<SequentialFile>(new Reader(it->second));
}

absl::StatusOr<std::vector<std::string>> MemoryFileSystem::GetChildren(
    const std::string& dir) {
  absl::MutexLock l(&mu_);
  const std::string prefix = absl::StrCat(dir, "/");
  std::vector<std::string> out;
  for (const auto& [path, bytes] : files_) {
    if (absl::StartsWith(path, prefix) &&
        path.find('/', prefix.size()) == std::string::npos) {
      out.push_back(path.substr(prefix.size()));
    }
  }
  return out;
}

absl::StatusOr<FileStat> MemoryFileSystem::Stat(const std::string& path) {
  absl::MutexLock l(&mu_);
  auto it = files_.find(path);
  if (it == files_.end()) return NotFound(path);
  FileStat s;
  s.size = it->second->size();
  return s;
}

std::string MemoryFileSystem::Take(const std::string& path) {
  absl::MutexLock l(&mu_);
  auto it = files_.find(path);
  if (it == files_.end()) return "";
  std::string bytes = std::move(*it->second);
  files_.erase(it);
  return bytes;
}

}  // namespace asyncps
