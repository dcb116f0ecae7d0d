#include "server/map_record_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/net.h"

namespace asyncps {

absl::StatusOr<VersionedMapRecord> LocalMapRecord::Read() {
  absl::MutexLock l(&mu_);
  return record_;
}

absl::StatusOr<SwapMapRecordResponse> LocalMapRecord::Swap(
    const MapRecord& record, uint64_t expected) {
  absl::MutexLock l(&mu_);
  SwapMapRecordResponse out;
  if (record_.version() == expected) {
    *record_.mutable_record() = record;
    record_.set_version(record_.version() + 1);
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
