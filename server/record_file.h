#ifndef ASYNCPS_SERVER_RECORD_FILE_H_
#define ASYNCPS_SERVER_RECORD_FILE_H_

// Files of length-prefixed records, written atomically and read with every
// byte checked: the container of a shard's checkpoint and of its spec file.
//
// Layout, all integers little-endian:
//
//   header  = magic (8 bytes) | format version (uint32)
//   body    = record*, record = length (uint32) | bytes (a protobuf message)
//   trailer = CRC-32 (zlib's crc32) of the body (uint32)
//
// Atomicity: the writer fills <path>.tmp, fsyncs it, renames it over <path>
// and fsyncs the directory, so after a crash at any point <path> is either
// the previous complete file or the new one. A leftover .tmp is never read;
// the next write replaces it.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/file_system.h"

namespace asyncps {

// What kind of record file: its magic and the format versions this build
// writes and reads.
struct RecordFileFormat {
  // Exactly 8 bytes, e.g. "APSCKPT\n".
  absl::string_view magic;
  uint32_t version = 1;          // written
  uint32_t oldest_readable = 1;  // read: oldest_readable..version
  // "checkpoint", "spec file": names the kind in error messages.
  absl::string_view what;
};

// Larger than any record asyncps writes (a slice holds at most 16 Mi
// floats, 3 x 64 MiB with Adam); a longer one is corruption.
inline constexpr uint32_t kMaxRecordBytes = 1u << 30;

// Writes `records` to `path` atomically as described above, through `fs`
// (nullptr = FileSystem::Default()). Returns the bytes written. On error
// (naming the file) the previous file is untouched and the .tmp removed
// (best effort: a .tmp is never read). An error of the final directory
// sync comes after the rename: the new file is in place then, but its
// durability is not known. Concurrent writers of one path must be
// serialized by the caller. `crc` (if given) receives the body's CRC-32,
// the file's trailer.
absl::StatusOr<uint64_t> WriteRecordFile(
    const std::string& path, const RecordFileFormat& format,
    const std::vector<std::string>& records, FileSystem* fs = nullptr,
    uint32_t* crc = nullptr);

// What ReadRecordFile saw besides the records.
struct RecordFileInfo {
  uint32_t version = 0;  // the file's format version
  uint64_t bytes = 0;    // its size
  uint32_t crc = 0;      // its body's CRC-32 (the trailer)
};

// Reads `path` front to back through `fs` (nullptr = FileSystem::Default()),
// calling visit(record, n) for the n-th record (0-based) as it is read, then
// checks the CRC-32. visit's errors end the read and are returned as they
// are. Errors name the file:
//   NOT_FOUND (and other errno codes)  the file cannot be opened or read;
//   DATA_LOSS  corrupt or truncated: bad magic, a format version outside
//              oldest_readable..version, a cut-off or oversized record, a
//              checksum mismatch, a file that ends before its size (it
//              shrank while being read).
// A visitor that applies records as they come must be prepared to discard
// them: the checksum is known only at the end.
absl::StatusOr<RecordFileInfo> ReadRecordFile(
    const std::string& path, const RecordFileFormat& format,
    absl::FunctionRef<absl::Status(absl::string_view record, int64_t n)> visit,
    FileSystem* fs = nullptr);

// Reads only the first record of `path` (no checksum: the rest of the file
// is not read), with the header checks and errors of ReadRecordFile. For a
// quick look at a file's identity; a full read still has to validate the
// file.
absl::StatusOr<std::string> ReadFirstRecord(const std::string& path,
                                            const RecordFileFormat& format,
                                            FileSystem* fs = nullptr);

// The directory part of `path` ("." when there is none).
std::string DirOf(const std::string& path);

// "<dir>/shard-<shard_index>-of-<num_shards>.<extension>": where a shard
// keeps a record file of its own (checkpoint, spec file).
std::string ShardFilePath(absl::string_view dir, int shard_index,
                          int num_shards, absl::string_view extension);

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_RECORD_FILE_H_
