#include "server/checkpoint_dir_id.h"

#include <cstdint>
#include <vector>

#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/record_file.h"

namespace asyncps {
namespace {

constexpr RecordFileFormat kFormat = {"APSDIRID", 1, 1,
                                      "checkpoint directory id"};
constexpr size_t kIdChars = 32;  // 128 random bits in hex

}  // namespace

std::string CheckpointDirIdPath(const std::string& dir) {
  return absl::StrCat(dir, dir.empty() || dir.back() == '/' ? "" : "/",
                      "replica.id");
}

absl::StatusOr<std::string> CheckpointDirId(const std::string& dir,
                                            FileSystem* fs) {
  if (fs == nullptr) fs = FileSystem::Default();
  const std::string path = CheckpointDirIdPath(dir);
  std::string id;
  absl::StatusOr<RecordFileInfo> read = ReadRecordFile(
      path, kFormat,
      [&](absl::string_view record, int64_t n) {
        if (n > 0 || record.size() != kIdChars) {
          return absl::DataLossError(
              absl::StrCat(path, ": not one id of ", kIdChars, " characters"));
        }
        id = std::string(record);
        return absl::OkStatus();
      },
      fs);
  if (read.ok() && id.empty()) {
    return absl::DataLossError(absl::StrCat(path, ": holds no id"));
  }
  if (read.ok()) return id;
  if (!absl::IsNotFound(read.status())) return read.status();
  absl::BitGen bits;
  id = absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(bits),
                       absl::Uniform<uint64_t>(bits));
  if (absl::Status made = fs->CreateDirs(dir); !made.ok()) return made;
  absl::StatusOr<uint64_t> written = WriteRecordFile(path, kFormat, {id}, fs);
  if (!written.ok()) return written.status();
  return id;
}

}  // namespace asyncps
