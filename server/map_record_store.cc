#include "server/map_record_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/net.h"
#include "server/record_file.h"

namespace asyncps {

namespace {

constexpr RecordFileFormat kFormat{"APSMAPR\n", 1, 1, "map record file"};

}  // namespace

LocalMapRecord::LocalMapRecord(std::string where, std::string path,
                               FileSystem* fs)
    : where_(std::move(where)),
      path_(std::move(path)),
      fs_(fs != nullptr ? fs : FileSystem::Default()) {
  if (path_.empty()) return;
  VersionedMapRecord loaded;
  absl::StatusOr<RecordFileInfo> read = ReadRecordFile(
      path_, kFormat,
      [&](absl::string_view bytes, int64_t n) -> absl::Status {
        if (n != 0 || !loaded.ParseFromArray(bytes.data(),
                                             static_cast<int>(bytes.size()))) {
          return absl::DataLossError("not one map record");
        }
        return absl::OkStatus();
      },
      fs_);
  absl::MutexLock l(&mu_);
  if (read.ok()) {
    record_ = std::move(loaded);
  } else if (!absl::IsNotFound(read.status())) {
    broken_ = absl::FailedPreconditionError(absl::StrCat(
        where_, ": its record file cannot be read (", read.status().message(),
        "); no map change until it is removed"));
  }
}

absl::StatusOr<VersionedMapRecord> LocalMapRecord::Read() {
  absl::MutexLock l(&mu_);
  if (!broken_.ok()) return broken_;
  return record_;
}

absl::StatusOr<SwapMapRecordResponse> LocalMapRecord::Swap(
    const MapRecord& record, uint64_t expected) {
  absl::MutexLock l(&mu_);
  if (!broken_.ok()) return broken_;
  SwapMapRecordResponse out;
  if (record_.version() == expected) {
    VersionedMapRecord next;
    *next.mutable_record() = record;
    next.set_version(record_.version() + 1);
    if (!path_.empty()) {
      absl::StatusOr<uint64_t> written =
          WriteRecordFile(path_, kFormat, {next.SerializeAsString()}, fs_);
      if (!written.ok()) {
        return absl::UnavailableError(absl::StrCat(
            where_,
            ": cannot write its record file: ", written.status().message()));
      }
    }
    record_ = std::move(next);
    out.set_swapped(true);
  }
  *out.mutable_current() = record_;
  return out;
}

RemoteMapRecord::RemoteMapRecord(std::string address, std::string run_id,
                                 const SecurityOptions& security,
                                 absl::Duration timeout)
    : address_(std::move(address)),
      run_id_(std::move(run_id)),
      timeout_(timeout),
      stub_(SlotMoves::NewStub(MakeChannel(address_, 0, security))) {}

std::string RemoteMapRecord::Where() const {
  return absl::StrCat("the run's map keeper at ", address_);
}

namespace {

absl::Status KeeperError(const grpc::Status& s, const std::string& where) {
  const absl::Status st = FromGrpcStatus(s);
  return absl::Status(
      st.code(),
      absl::StrCat(where, ": ", st.message(),
                   absl::IsUnavailable(st) || absl::IsDeadlineExceeded(st)
                       ? " (no map change while it does not "
                         "answer)"
                       : ""));
}

}  // namespace

absl::StatusOr<VersionedMapRecord> RemoteMapRecord::Read() {
  ReadMapRecordRequest request;
  request.set_run_id(run_id_);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
  VersionedMapRecord out;
  const grpc::Status s = stub_->ReadMapRecord(&ctx, request, &out);
  if (!s.ok()) return KeeperError(s, Where());
  return out;
}

absl::StatusOr<SwapMapRecordResponse> RemoteMapRecord::Swap(
    const MapRecord& record, uint64_t expected) {
  SwapMapRecordRequest request;
  request.set_run_id(run_id_);
  *request.mutable_record() = record;
  request.set_expected_version(expected);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
  SwapMapRecordResponse out;
  const grpc::Status s = stub_->SwapMapRecord(&ctx, request, &out);
  if (!s.ok()) return KeeperError(s, Where());
  return out;
}

}  // namespace asyncps
