#include "server/record_file.h"

#include <zlib.h>

#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace asyncps {
namespace {

constexpr size_t kMagicBytes = 8;
constexpr size_t kHeaderBytes = kMagicBytes + 4;
constexpr size_t kLengthBytes = 4;
constexpr size_t kTrailerBytes = 4;
// Small records are gathered into writes of about this size.
constexpr size_t kWriteBufferBytes = 1 << 20;

void PutU32(uint32_t v, char* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint32_t GetU32(const char* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) {
    v |= static_cast<uint32_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  }
  return v;
}

uint32_t Crc32(uint32_t crc, absl::string_view data) {
  return static_cast<uint32_t>(
      crc32_z(crc, reinterpret_cast<const Bytef*>(data.data()), data.size()));
}

// A file being written: buffered appends, the CRC of everything appended
// since the header.
class OutFile {
 public:
  explicit OutFile(WritableFile* file) : file_(file) {}
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;

  // Appends bytes; `checksummed` ones count towards crc().
  absl::Status Append(absl::string_view data, bool checksummed = true) {
    if (checksummed) crc_ = Crc32(crc_, data);
    bytes_ += data.size();
    if (buffer_.size() + data.size() <= kWriteBufferBytes) {
      buffer_.append(data.data(), data.size());
      return absl::OkStatus();
    }
    absl::Status s = Flush();
    if (!s.ok()) return s;
    if (data.size() < kWriteBufferBytes) {
      buffer_.append(data.data(), data.size());
      return absl::OkStatus();
    }
    return file_->Append(data);
  }

  absl::Status Flush() {
    absl::Status s =
        buffer_.empty() ? absl::OkStatus() : file_->Append(buffer_);
    buffer_.clear();
    return s;
  }

  // Flushes, fsyncs and closes.
  absl::Status SyncAndClose() {
    absl::Status s = Flush();
    if (s.ok()) s = file_->Sync();
    if (s.ok()) s = file_->Close();
    return s;
  }

  uint32_t crc() const { return crc_; }
  uint64_t bytes() const { return bytes_; }

 private:
  WritableFile* const file_;
  std::string buffer_;
  uint32_t crc_ = 0;
  uint64_t bytes_ = 0;
};

// A file being read front to back, with the CRC of what was read since the
// header.
class InFile {
 public:
  InFile(std::unique_ptr<SequentialFile> file, std::string path,
         absl::string_view what)
      : file_(std::move(file)),
        path_(std::move(path)),
        size_(file_->size()),
        what_(what) {}
  InFile(const InFile&) = delete;
  InFile& operator=(const InFile&) = delete;

  // Reads exactly n bytes into *out; the file's size was checked by the
  // caller, so a short read means the file changed under us (or the
  // storage lost its end): DATA_LOSS.
  absl::Status Read(size_t n, std::string* out, bool checksummed = true) {
    out->resize(n);
    absl::StatusOr<size_t> got = n == 0 ? 0 : file_->Read(&(*out)[0], n);
    if (!got.ok()) return got.status();
    if (*got < n) {
      return Corrupt(absl::StrCat("file ended at byte ", pos_ + *got, " of ",
                                  size_,
                                  " while reading (shrunk while being "
                                  "read?)"));
    }
    pos_ += n;
    if (checksummed) crc_ = Crc32(crc_, *out);
    return absl::OkStatus();
  }

  absl::Status Corrupt(absl::string_view why) const {
    return absl::DataLossError(absl::StrCat(what_, " ", path_, ": ", why));
  }

  uint64_t pos() const { return pos_; }
  uint64_t size() const { return size_; }
  uint32_t crc() const { return crc_; }

 private:
  const std::unique_ptr<SequentialFile> file_;
  const std::string path_;
  const uint64_t size_;
  const absl::string_view what_;
  uint64_t pos_ = 0;
  uint32_t crc_ = 0;
};

// Opens `path` and checks its header; `in` reads on from the first record.
absl::StatusOr<std::unique_ptr<InFile>> OpenChecked(
    const std::string& path, const RecordFileFormat& format, FileSystem* fs,
    uint32_t* version) {
  if (fs == nullptr) fs = FileSystem::Default();
  absl::StatusOr<std::unique_ptr<SequentialFile>> file =
      fs->NewSequentialFile(path);
  if (!file.ok()) return file.status();
  auto in = std::make_unique<InFile>(*std::move(file), path, format.what);
  if (in->size() < kHeaderBytes + kTrailerBytes) {
    return in->Corrupt(absl::StrCat(
        "only ", in->size(), " bytes (truncated or not a ", format.what, ")"));
  }
  std::string buffer;
  absl::Status s = in->Read(kHeaderBytes, &buffer, false);
  if (!s.ok()) return s;
  if (format.magic.size() != kMagicBytes ||
      std::memcmp(buffer.data(), format.magic.data(), kMagicBytes) != 0) {
    return in->Corrupt(
        absl::StrCat("bad magic (not an asyncps ", format.what, ")"));
  }
  *version = GetU32(buffer.data() + kMagicBytes);
  if (*version < format.oldest_readable || *version > format.version) {
    return in->Corrupt(
        absl::StrCat("format version ", *version, " (this build reads ",
                     format.oldest_readable, " to ", format.version, ")"));
  }
  return in;
}

// Reads the next record of `in` into *record; `body_end` is where the
// trailer starts.
absl::Status NextRecord(InFile& in, uint64_t body_end, int64_t n,
                        std::string* record) {
  const uint64_t offset = in.pos();
  if (body_end - offset < kLengthBytes) {
    return in.Corrupt(absl::StrCat("record ", n, " at byte ", offset,
                                   " is cut off (truncated?)"));
  }
  absl::Status s = in.Read(kLengthBytes, record);
  if (!s.ok()) return s;
  const uint32_t length = GetU32(record->data());
  if (length > kMaxRecordBytes || length > body_end - in.pos()) {
    return in.Corrupt(
        absl::StrCat("record ", n, " at byte ", offset, " claims ", length,
                     " bytes; ", body_end - in.pos(),
                     " remain before the checksum (truncated or corrupt)"));
  }
  return in.Read(length, record);
}

}  // namespace

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string ShardFilePath(absl::string_view dir, int shard_index,
                          int num_shards, absl::string_view extension) {
  const std::string file =
      absl::StrFormat("shard-%d-of-%d.%s", shard_index, num_shards, extension);
  if (dir.empty()) return file;
  return absl::StrCat(dir, dir.back() == '/' ? "" : "/", file);
}

absl::StatusOr<uint64_t> WriteRecordFile(
    const std::string& path, const RecordFileFormat& format,
    const std::vector<std::string>& records, FileSystem* fs, uint32_t* crc) {
  if (format.magic.size() != kMagicBytes) {
    return absl::InternalError(
        absl::StrCat("bad record file magic for ", format.what));
  }
  if (fs == nullptr) fs = FileSystem::Default();
  const std::string tmp = path + ".tmp";
  absl::StatusOr<std::unique_ptr<WritableFile>> file = fs->NewWritableFile(tmp);
  if (!file.ok()) return file.status();
  absl::Status s;
  uint64_t bytes = 0;
  {
    OutFile out(file->get());
    char header[kHeaderBytes];
    std::memcpy(header, format.magic.data(), kMagicBytes);
    PutU32(format.version, header + kMagicBytes);
    s = out.Append(absl::string_view(header, sizeof(header)), false);
    for (const std::string& record : records) {
      if (!s.ok()) break;
      if (record.size() > kMaxRecordBytes) {
        s = absl::InternalError(absl::StrCat(format.what, " ", path,
                                             ": a record of ", record.size(),
                                             " bytes is too large"));
        break;
      }
      char length[kLengthBytes];
      PutU32(static_cast<uint32_t>(record.size()), length);
      s = out.Append(absl::string_view(length, sizeof(length)));
      if (s.ok()) s = out.Append(record);
    }
    if (s.ok()) {
      char trailer[kTrailerBytes];
      PutU32(out.crc(), trailer);
      if (crc != nullptr) *crc = out.crc();
      s = out.Append(absl::string_view(trailer, sizeof(trailer)), false);
    }
    if (s.ok()) s = out.SyncAndClose();
    bytes = out.bytes();
  }
  file->reset();  // closed (without syncing) if the write failed
  if (s.ok()) s = fs->Rename(tmp, path);
  if (!s.ok()) {
    fs->Remove(tmp).IgnoreError();  // best effort; a .tmp is never read
    return s;
  }
  s = fs->SyncDir(DirOf(path));
  if (!s.ok()) return s;
  return bytes;
}

absl::StatusOr<RecordFileInfo> ReadRecordFile(
    const std::string& path, const RecordFileFormat& format,
    absl::FunctionRef<absl::Status(absl::string_view record, int64_t n)> visit,
    FileSystem* fs) {
  RecordFileInfo info;
  absl::StatusOr<std::unique_ptr<InFile>> opened =
      OpenChecked(path, format, fs, &info.version);
  if (!opened.ok()) return opened.status();
  InFile& in = **opened;
  info.bytes = in.size();
  const uint64_t body_end = in.size() - kTrailerBytes;
  std::string record;
  for (int64_t n = 0; in.pos() < body_end; ++n) {
    absl::Status s = NextRecord(in, body_end, n, &record);
    if (!s.ok()) return s;
    s = visit(record, n);
    if (!s.ok()) return s;
  }
  const uint32_t computed = in.crc();
  absl::Status s = in.Read(kTrailerBytes, &record, false);
  if (!s.ok()) return s;
  const uint32_t stored = GetU32(record.data());
  if (stored != computed) {
    return in.Corrupt(absl::StrFormat(
        "checksum mismatch (stored %08x, computed %08x)", stored, computed));
  }
  info.crc = stored;
  return info;
}

absl::StatusOr<std::string> ReadFirstRecord(const std::string& path,
                                            const RecordFileFormat& format,
                                            FileSystem* fs) {
  uint32_t version = 0;
  absl::StatusOr<std::unique_ptr<InFile>> opened =
      OpenChecked(path, format, fs, &version);
  if (!opened.ok()) return opened.status();
  InFile& in = **opened;
  const uint64_t body_end = in.size() - kTrailerBytes;
  if (in.pos() >= body_end) return in.Corrupt("no records");
  std::string record;
  absl::Status s = NextRecord(in, body_end, 0, &record);
  if (!s.ok()) return s;
  return record;
}

}  // namespace asyncps
