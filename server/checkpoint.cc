#include "server/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/names.h"
#include "common/payload.h"
#include "common/sharding.h"
#include "common/tensor_layout.h"
#include "proto/checkpoint.pb.h"

namespace asyncps {
namespace {

constexpr char kMagic[8] = {'A', 'P', 'S', 'C', 'K', 'P', 'T', '\n'};
constexpr uint32_t kFormatVersion = 3;          // 3: sparse tables
constexpr uint32_t kOldestReadableVersion = 1;  // no worker records
constexpr size_t kHeaderBytes = sizeof(kMagic) + 4;
constexpr size_t kLengthBytes = 4;
constexpr size_t kTrailerBytes = 4;
// Larger than any record the writer makes: a slice holds at most
// ShardStoreOptions::max_slice_elems (16 Mi) floats, 3 x 64 MiB with Adam.
constexpr uint32_t kMaxRecordBytes = 1u << 30;
// Rows of a sparse table per record.
constexpr int kRowsPerRecord = 4096;
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

absl::Status IoError(int err, absl::string_view what, absl::string_view path) {
  return absl::ErrnoToStatus(err, absl::StrCat(what, " ", path));
}

// A file being written: buffered appends, the CRC of everything appended
// since the header, fsync. Closes (without syncing) on destruction.
class OutFile {
 public:
  OutFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;
  ~OutFile() {
    if (fd_ >= 0) ::close(fd_);
  }

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
    return WriteAll(data);
  }

  absl::Status Flush() {
    absl::Status s = WriteAll(buffer_);
    buffer_.clear();
    return s;
  }

  // Flushes, fsyncs and closes.
  absl::Status SyncAndClose() {
    absl::Status s = Flush();
    if (!s.ok()) return s;
    if (::fsync(fd_) != 0) return IoError(errno, "fsync", path_);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) return IoError(errno, "close", path_);
    return absl::OkStatus();
  }

  uint32_t crc() const { return crc_; }
  uint64_t bytes() const { return bytes_; }

 private:
  absl::Status WriteAll(absl::string_view data) {
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

  int fd_;
  const std::string path_;
  std::string buffer_;
  uint32_t crc_ = 0;
  uint64_t bytes_ = 0;
};

// fsync of a directory, so that a rename in it is durable.
absl::Status SyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return IoError(errno, "open directory", dir);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return IoError(err, "fsync directory", dir);
  return absl::OkStatus();
}

// Appends one serialized record to an image, counting its bytes.
void AddRecord(const CheckpointRecord& record, CheckpointImage* image) {
  image->records.emplace_back();
  std::string& bytes = image->records.back();
  record.SerializeToString(&bytes);
  image->body_bytes += kLengthBytes + bytes.size();
}

// A file being read front to back, with the CRC of what was read since the
// header.
class InFile {
 public:
  InFile(int fd, std::string path, uint64_t size)
      : fd_(fd), path_(std::move(path)), size_(size) {}
  InFile(const InFile&) = delete;
  InFile& operator=(const InFile&) = delete;
  ~InFile() { ::close(fd_); }

  // Reads exactly n bytes into *out; the file's size was checked by the
  // caller, so a short read means the file changed under us.
  absl::Status Read(size_t n, std::string* out, bool checksummed = true) {
    out->resize(n);
    size_t done = 0;
    while (done < n) {
      const ssize_t r = ::read(fd_, &(*out)[done], n - done);
      if (r < 0) {
        if (errno == EINTR) continue;
        return IoError(errno, "read", path_);
      }
      if (r == 0) {
        return absl::DataLossError(absl::StrCat(
            "checkpoint ", path_, ": file ended at byte ", pos_ + done,
            " while reading (shrunk while being read?)"));
      }
      done += static_cast<size_t>(r);
    }
    pos_ += n;
    if (checksummed) crc_ = Crc32(crc_, *out);
    return absl::OkStatus();
  }

  uint64_t pos() const { return pos_; }
  uint64_t size() const { return size_; }
  uint32_t crc() const { return crc_; }

 private:
  const int fd_;
  const std::string path_;
  const uint64_t size_;
  uint64_t pos_ = 0;
  uint32_t crc_ = 0;
};

// Restores records into the store and checks that they form a complete
// checkpoint of the store's shard.
class Restorer {
 public:
  Restorer(const std::string& path, ShardStore* store)
      : path_(path), store_(store) {}

  // Applies one record, the n-th (0-based) in the body.
  absl::Status Apply(const CheckpointRecord& record, int64_t n) {
    if (n == 0 && !record.has_identity()) {
      return Corrupt("the first record is not the shard identity");
    }
    if (end_seen_) return Corrupt("records follow the end record");
    switch (record.record_case()) {
      case CheckpointRecord::kIdentity:
        if (n != 0) return Corrupt("a second identity record");
        identity_ = record.identity();
        if (identity_.shard_index() != store_->options().shard_index ||
            identity_.num_shards() != store_->options().num_shards) {
          // Reported only if the rest of the file is intact: a corrupt byte
          // in the identity must read as corruption.
          wrong_shard_ = true;
        }
        return absl::OkStatus();
      case CheckpointRecord::kWorker:
        if (in_tensor_ || in_tables_) {
          return Corrupt("a worker record after the tensors");
        }
        if (record.worker().worker_id() < 0 ||
            record.worker().incarnation() == 0 || record.worker().clock() < 0) {
          return Corrupt(absl::StrCat("worker record ", n, " is malformed"));
        }
        workers_.push_back(record.worker());
        return absl::OkStatus();
      case CheckpointRecord::kTensor:
        if (in_tables_) return Corrupt("a tensor record after the tables");
        return wrong_shard_ ? absl::OkStatus() : StartTensor(record.tensor());
      case CheckpointRecord::kTable:
        return wrong_shard_ ? absl::OkStatus() : StartTable(record.table());
      case CheckpointRecord::kRows:
        return wrong_shard_ ? absl::OkStatus() : AddRows(record.rows());
      case CheckpointRecord::kSlice:
        return wrong_shard_ ? absl::OkStatus() : AddSlice(record.slice());
      case CheckpointRecord::kEnd: {
        end_seen_ = true;
        if (wrong_shard_) return absl::OkStatus();
        absl::Status s = FinishTensor();
        if (!s.ok()) return s;
        if (record.end().tensors() != tensors_ ||
            record.end().slices() != slices_ ||
            record.end().tables() != tables_ || record.end().rows() != rows_) {
          return Corrupt(absl::StrCat(
              "the end record counts ", record.end().tensors(), " tensors, ",
              record.end().slices(), " slices, ", record.end().tables(),
              " tables and ", record.end().rows(), " rows; the file holds ",
              tensors_, ", ", slices_, ", ", tables_, " and ", rows_));
        }
        return absl::OkStatus();
      }
      default:
        return Corrupt(absl::StrCat("record ", n, " is of an unknown kind"));
    }
  }

  // After the CRC check: the outcome for an intact file.
  absl::Status Finish() const {
    if (!end_seen_) {
      return Corrupt(
          "no end record (truncated or written by a crashed writer)");
    }
    if (wrong_shard_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", path_, " belongs to shard ", identity_.shard_index(),
          " of ", identity_.num_shards(), ", not to this shard ",
          store_->options().shard_index, " of ", store_->options().num_shards));
    }
    return absl::OkStatus();
  }

  const CheckpointIdentity& identity() const { return identity_; }
  int32_t tensors() const { return tensors_; }
  int64_t slices() const { return slices_; }
  uint64_t slice_updates() const { return slice_updates_; }
  int32_t tables() const { return tables_; }
  int64_t rows() const { return rows_; }
  std::vector<CheckpointWorker> TakeWorkers() { return std::move(workers_); }

  absl::Status Corrupt(absl::string_view what) const {
    return absl::DataLossError(absl::StrCat("checkpoint ", path_, ": ", what));
  }

 private:
  absl::Status StartTensor(const TensorSpec& spec) {
    absl::Status s = FinishTensor();
    if (!s.ok()) return s;
    s = store_->RestoreTensor(spec);
    if (absl::IsResourceExhausted(s)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("checkpoint ", path_, ": ", s.message()));
    }
    if (!s.ok()) {
      return Corrupt(
          absl::StrCat("tensor ", QuoteName(spec.name()), ": ", s.message()));
    }
    absl::StatusOr<TensorLayout> layout = TensorLayout::FromSpec(spec);
    if (!layout.ok()) {
      return Corrupt(absl::StrCat("tensor ", QuoteName(spec.name()), ": ",
                                  layout.status().message()));
    }
    tensor_ = spec.name();
    in_tensor_ = true;
    restored_.assign(layout->num_slices(), false);
    expected_ = LocalSliceCount(spec.name(), layout->num_slices(),
                                store_->options().shard_index,
                                store_->options().num_shards);
    got_ = 0;
    ++tensors_;
    return absl::OkStatus();
  }

  absl::Status AddSlice(const CheckpointSlice& slice) {
    if (!in_tensor_) return Corrupt("a slice record before any tensor");
    const std::string where = absl::StrCat("slice ", slice.index(),
                                           " of tensor ", QuoteName(tensor_));
    if (slice.index() < restored_.size() && restored_[slice.index()]) {
      return Corrupt(absl::StrCat(where, " appears twice"));
    }
    std::vector<absl::string_view> state(slice.optimizer_state().begin(),
                                         slice.optimizer_state().end());
    absl::Status s = store_->RestoreSlice(
        tensor_, slice.index(), slice.version(), slice.values(), state);
    if (!s.ok()) return Corrupt(s.message());
    restored_[slice.index()] = true;
    ++got_;
    ++slices_;
    slice_updates_ += slice.version();
    return absl::OkStatus();
  }

  absl::Status StartTable(const TableSpec& spec) {
    absl::Status s = FinishTensor();
    if (!s.ok()) return s;
    in_tensor_ = false;
    in_tables_ = true;
    s = store_->tables().RestoreTable(spec);
    if (absl::IsResourceExhausted(s)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("checkpoint ", path_, ": ", s.message()));
    }
    if (!s.ok()) {
      return Corrupt(
          absl::StrCat("table ", QuoteName(spec.name()), ": ", s.message()));
    }
    table_ = spec.name();
    ++tables_;
    return absl::OkStatus();
  }

  absl::Status AddRows(const CheckpointRows& rows) {
    if (!in_tables_) return Corrupt("a rows record before any table");
    absl::Status s = store_->tables().RestoreRows(
        table_, absl::MakeConstSpan(rows.ids().data(), rows.ids_size()),
        absl::MakeConstSpan(rows.versions().data(), rows.versions_size()),
        absl::MakeConstSpan(rows.touched().data(), rows.touched_size()),
        rows.values(), rows.optimizer_state());
    if (absl::IsResourceExhausted(s)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("checkpoint ", path_, ": ", s.message()));
    }
    if (!s.ok()) return Corrupt(s.message());
    rows_ += rows.ids_size();
    return absl::OkStatus();
  }

  absl::Status FinishTensor() {
    if (!in_tensor_ || got_ == expected_) return absl::OkStatus();
    return Corrupt(
        absl::StrCat("tensor ", QuoteName(tensor_), " has ", expected_,
                     " slices on this shard; the file holds ", got_));
  }

  const std::string& path_;
  ShardStore* const store_;
  CheckpointIdentity identity_;
  bool wrong_shard_ = false;
  bool end_seen_ = false;
  // The tensor whose slices are being read.
  bool in_tensor_ = false;
  std::string tensor_;
  std::vector<bool> restored_;
  int64_t expected_ = 0;
  int64_t got_ = 0;
  int32_t tensors_ = 0;
  int64_t slices_ = 0;
  uint64_t slice_updates_ = 0;
  // The table whose rows are being read (format 3).
  bool in_tables_ = false;
  std::string table_;
  int32_t tables_ = 0;
  int64_t rows_ = 0;
  std::vector<CheckpointWorker> workers_;
};

// Appends a `table` record per sparse table and `rows` records of up to
// kRowsPerRecord rows, each row copied under its partition's lock.
void CaptureTables(const TableStore& tables, CheckpointImage* image) {
  CheckpointRecord record;
  CheckpointRecord rows_record;
  CheckpointRows* rows = rows_record.mutable_rows();
  auto flush = [&] {
    if (rows->ids_size() == 0) return;
    AddRecord(rows_record, image);
    rows->Clear();
  };
  tables
      .Export(
          [&](const TableSpec& spec) {
            flush();
            *record.mutable_table() = spec;
            AddRecord(record, image);
            ++image->tables;
            return absl::OkStatus();
          },
          [&](const SparseTable::RowView& r) {
            rows->add_ids(r.id);
            rows->add_versions(r.version);
            rows->add_touched(r.touched);
            rows->mutable_values()->append(
                reinterpret_cast<const char*>(r.values), r.dim * sizeof(float));
            rows->mutable_optimizer_state()->append(
                reinterpret_cast<const char*>(r.state),
                r.state_floats * sizeof(float));
            ++image->rows;
            if (rows->ids_size() >= kRowsPerRecord) flush();
            return absl::OkStatus();
          })
      .IgnoreError();  // the visitors never fail
  flush();
}

}  // namespace

std::string CheckpointPath(absl::string_view dir, int shard_index,
                           int num_shards) {
  const std::string file =
      absl::StrFormat("shard-%d-of-%d.ckpt", shard_index, num_shards);
  if (dir.empty()) return file;
  return absl::StrCat(dir, dir.back() == '/' ? "" : "/", file);
}

CheckpointImage CaptureCheckpoint(const ShardStore& store,
                                  const std::vector<CheckpointWorker>& workers,
                                  absl::Time now,
                                  absl::string_view build_version) {
  CheckpointImage image;
  image.shard_index = store.options().shard_index;
  image.num_shards = store.options().num_shards;
  image.taken = now;
  CheckpointRecord record;
  CheckpointIdentity* identity = record.mutable_identity();
  identity->set_shard_index(image.shard_index);
  identity->set_num_shards(image.num_shards);
  identity->set_unix_time_ms(absl::ToUnixMillis(now));
  identity->set_build_version(std::string(build_version));
  AddRecord(record, &image);
  for (const CheckpointWorker& w : workers) {
    *record.mutable_worker() = w;
    AddRecord(record, &image);
    ++image.workers;
  }
  // Kept apart so that its buffers are reused from slice to slice.
  CheckpointRecord slice_record;
  CheckpointSlice* slice = slice_record.mutable_slice();
  store
      .Export(
          [&](const TensorSpec& spec) {
            *record.mutable_tensor() = spec;
            AddRecord(record, &image);
            ++image.tensors;
            return absl::OkStatus();
          },
          [&](const ShardStore::SliceView& v) {
            // Serialized under the slice's lock: the one copy.
            slice->set_index(v.index);
            slice->set_version(v.version);
            EncodeFloats(v.values.data(), v.values.size(),
                         slice->mutable_values());
            auto* state = slice->mutable_optimizer_state();
            while (state->size() > static_cast<int>(v.optimizer_state.size())) {
              state->RemoveLast();
            }
            while (state->size() < static_cast<int>(v.optimizer_state.size())) {
              state->Add();
            }
            for (size_t i = 0; i < v.optimizer_state.size(); ++i) {
              EncodeFloats(v.optimizer_state[i].data(),
                           v.optimizer_state[i].size(), state->Mutable(i));
            }
            AddRecord(slice_record, &image);
            ++image.slices;
            image.slice_updates += v.version;
            return absl::OkStatus();
          })
      .IgnoreError();  // the visitors never fail
  CaptureTables(store.tables(), &image);
  CheckpointEnd* end = record.mutable_end();
  end->set_tensors(image.tensors);
  end->set_slices(image.slices);
  end->set_tables(image.tables);
  end->set_rows(image.rows);
  AddRecord(record, &image);
  return image;
}

absl::StatusOr<CheckpointInfo> WriteCheckpoint(const CheckpointImage& image,
                                               absl::string_view dir,
                                               Clock* clock) {
  const absl::Time start = clock->Now();
  const std::string path =
      CheckpointPath(dir, image.shard_index, image.num_shards);
  const std::string tmp = path + ".tmp";
  CheckpointInfo info;
  info.set_path(path);
  info.set_unix_time_ms(absl::ToUnixMillis(image.taken));
  info.set_tensors(image.tensors);
  info.set_slices(static_cast<int32_t>(image.slices));
  info.set_workers(image.workers);
  info.set_slice_updates(image.slice_updates);
  info.set_tables(image.tables);
  info.set_rows(static_cast<uint64_t>(image.rows));
  info.set_pause_ms(absl::ToDoubleMilliseconds(image.pause));

  const int fd =
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return IoError(errno, "create", tmp);
  absl::Status s;
  {
    OutFile out(fd, tmp);
    char header[kHeaderBytes];
    std::memcpy(header, kMagic, sizeof(kMagic));
    PutU32(kFormatVersion, header + sizeof(kMagic));
    s = out.Append(absl::string_view(header, sizeof(header)), false);
    for (const std::string& record : image.records) {
      if (!s.ok()) break;
      if (record.size() > kMaxRecordBytes) {
        s = absl::InternalError(absl::StrCat("checkpoint ", path,
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
      s = out.Append(absl::string_view(trailer, sizeof(trailer)), false);
    }
    if (s.ok()) s = out.SyncAndClose();
    info.set_bytes(out.bytes());
  }
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    s = IoError(errno, absl::StrCat("rename ", tmp, " to"), path);
  }
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  s = SyncDir(dir.empty() ? std::string(".") : std::string(dir));
  if (!s.ok()) return s;
  info.set_duration_ms(absl::ToDoubleMilliseconds(clock->Now() - start));
  return info;
}

absl::StatusOr<RestoredCheckpoint> RestoreCheckpoint(const std::string& path,
                                                     ShardStore* store) {
  const absl::Time start = absl::Now();
  if (store->Size().tensors != 0 || store->tables().totals().tables != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot restore checkpoint ", path,
                     " into a shard holding tensors or tables"));
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return IoError(errno, "open checkpoint", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return IoError(err, "stat checkpoint", path);
  }
  InFile in(fd, path, static_cast<uint64_t>(st.st_size));
  Restorer restorer(path, store);
  if (in.size() < kHeaderBytes + kTrailerBytes) {
    return restorer.Corrupt(absl::StrCat("only ", in.size(),
                                         " bytes (truncated or not a "
                                         "checkpoint)"));
  }
  std::string buffer;
  absl::Status s = in.Read(kHeaderBytes, &buffer, false);
  if (!s.ok()) return s;
  if (std::memcmp(buffer.data(), kMagic, sizeof(kMagic)) != 0) {
    return restorer.Corrupt("bad magic (not an asyncps checkpoint)");
  }
  const uint32_t version = GetU32(buffer.data() + sizeof(kMagic));
  if (version < kOldestReadableVersion || version > kFormatVersion) {
    return restorer.Corrupt(
        absl::StrCat("format version ", version, " (this build reads ",
                     kOldestReadableVersion, " to ", kFormatVersion, ")"));
  }

  const uint64_t body_end = in.size() - kTrailerBytes;
  CheckpointRecord record;
  for (int64_t n = 0; in.pos() < body_end; ++n) {
    const uint64_t offset = in.pos();
    if (body_end - offset < kLengthBytes) {
      return restorer.Corrupt(absl::StrCat("record ", n, " at byte ", offset,
                                           " is cut off (truncated?)"));
    }
    s = in.Read(kLengthBytes, &buffer);
    if (!s.ok()) return s;
    const uint32_t length = GetU32(buffer.data());
    if (length > kMaxRecordBytes || length > body_end - in.pos()) {
      return restorer.Corrupt(
          absl::StrCat("record ", n, " at byte ", offset, " claims ", length,
                       " bytes; ", body_end - in.pos(),
                       " remain before the checksum (truncated or corrupt)"));
    }
    s = in.Read(length, &buffer);
    if (!s.ok()) return s;
    if (!record.ParseFromString(buffer)) {
      return restorer.Corrupt(
          absl::StrCat("record ", n, " at byte ", offset, " does not parse"));
    }
    s = restorer.Apply(record, n);
    if (!s.ok()) return s;
  }
  const uint32_t computed = in.crc();
  s = in.Read(kTrailerBytes, &buffer, false);
  if (!s.ok()) return s;
  const uint32_t stored = GetU32(buffer.data());
  if (stored != computed) {
    return restorer.Corrupt(absl::StrFormat(
        "checksum mismatch (stored %08x, computed %08x)", stored, computed));
  }
  s = restorer.Finish();
  if (!s.ok()) return s;

  RestoredCheckpoint out;
  CheckpointInfo& info = out.info;
  info.set_path(path);
  info.set_unix_time_ms(restorer.identity().unix_time_ms());
  info.set_bytes(in.size());
  info.set_tensors(restorer.tensors());
  info.set_slices(static_cast<int32_t>(restorer.slices()));
  info.set_slice_updates(restorer.slice_updates());
  info.set_tables(restorer.tables());
  info.set_rows(static_cast<uint64_t>(restorer.rows()));
  out.workers = restorer.TakeWorkers();
  info.set_workers(static_cast<int32_t>(out.workers.size()));
  info.set_duration_ms(absl::ToDoubleMilliseconds(absl::Now() - start));
  return out;
}

}  // namespace asyncps
