#include "tests/staleness/harness.h"

#include <grpcpp/grpcpp.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/net.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/tensor_specs.h"

namespace asyncps {
namespace staleness {

namespace {

// How long the harness waits for an event before it calls the test hung
// (generous: a loaded machine is slow, not wrong).
constexpr absl::Duration kEventDeadline = absl::Seconds(60);

void SetDeadline(grpc::ClientContext* ctx, absl::Duration timeout) {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

}  // namespace

TensorSpec ConstantSgdSpec(const std::string& name, int64_t elems,
                           float init_value, float lr, int64_t slice_elems) {
  return testing::ConstantSpec(name, {elems}, init_value, testing::SgdSpec(lr),
                               slice_elems);
}

absl::StatusOr<testing::ServerProcess> StartShard(
    const std::vector<std::string>& flags) {
  return testing::StartPsServer(/*shard_index=*/0, /*num_shards=*/1, flags);
}

absl::StatusOr<std::unique_ptr<PsClient>> ConnectWorker(
    const std::string& address, int32_t worker_id, uint64_t incarnation,
    absl::Duration rpc_timeout) {
  PsClientOptions options;
  options.servers = {address};
  options.worker_id = worker_id;
  options.incarnation = incarnation;
  options.retry.attempt_timeout = rpc_timeout;
  options.retry.call_deadline = rpc_timeout;
  options.retry.max_attempts = 1;
  return PsClient::Connect(std::move(options));
}

absl::StatusOr<StatusResponse> GetStatus(ParameterServer::Stub* stub) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Seconds(10));
  StatusResponse response;
  const grpc::Status s = stub->Status(&ctx, StatusRequest(), &response);
  if (!s.ok()) return FromGrpcStatus(s);
  return response;
}

const WorkerStatus* FindWorker(const StatusResponse& status,
                               int32_t worker_id) {
  for (const WorkerStatus& w : status.workers()) {
    if (w.worker_id() == worker_id) return &w;
  }
  return nullptr;
}

absl::Status RawHeartbeat(ParameterServer::Stub* stub, int32_t worker_id,
                          uint64_t incarnation, int64_t clock) {
  HeartbeatRequest request;
  request.mutable_worker()->set_worker_id(worker_id);
  request.mutable_worker()->set_incarnation(incarnation);
  request.mutable_worker()->set_clock(clock);
  HeartbeatResponse response;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Seconds(10));
  return FromGrpcStatus(stub->Heartbeat(&ctx, request, &response));
}

BackgroundCall::BackgroundCall(std::function<absl::Status()> fn)
    : started_(absl::Now()) {
  thread_ = std::thread([this, fn = std::move(fn)] {
    absl::Status s = fn();
    absl::MutexLock l(&mu_);
    status_ = std::move(s);
    finished_ = absl::Now();
    done_ = true;
  });
}

BackgroundCall::~BackgroundCall() { thread_.join(); }

bool BackgroundCall::done() const {
  absl::MutexLock l(&mu_);
  return done_;
}

bool BackgroundCall::WaitDone(absl::Duration timeout) const {
  absl::MutexLock l(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&done_), timeout);
}

absl::Status BackgroundCall::status() const {
  absl::MutexLock l(&mu_);
  return status_;
}

absl::Time BackgroundCall::finished() const {
  absl::MutexLock l(&mu_);
  return finished_;
}

KeepAlive::KeepAlive(const std::string& address, int32_t worker_id,
                     uint64_t incarnation, int64_t clock, absl::Duration period)
    : stub_(ParameterServer::NewStub(MakeChannel(address))) {
  thread_ = std::thread([this, worker_id, incarnation, clock, period] {
    for (;;) {
      {
        absl::MutexLock l(&mu_);
        last_beat_started_ = absl::Now();
      }
      if (RawHeartbeat(stub_.get(), worker_id, incarnation, clock).ok()) {
        ++beats_;
      } else {
        ++failures_;
      }
      absl::MutexLock l(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), period)) return;
    }
  });
}

KeepAlive::~KeepAlive() { Stop(); }

void KeepAlive::Stop() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

absl::Time KeepAlive::last_beat_started() const {
  absl::MutexLock l(&mu_);
  return last_beat_started_;
}

StatusResponse Shard::Status() {
  absl::StatusOr<StatusResponse> s = GetStatus(stub.get());
  REQUIRE_OK(s.status());
  return *std::move(s);
}

void Shard::AwaitPullWaits(uint64_t n) {
  const absl::Status s = testing::WaitFor(
      [&] {
        absl::StatusOr<StatusResponse> st = GetStatus(stub.get());
        return st.ok() && st->counters().pull_waits() >= n;
      },
      kEventDeadline, absl::StrCat("pull_waits >= ", n));
  INFO("server log:\n" << server.process->LogTail());
  REQUIRE_OK(s);
}

uint32_t Shard::WaitingPulls(int32_t worker_id) {
  const StatusResponse status = Status();
  const WorkerStatus* w = FindWorker(status, worker_id);
  return w == nullptr ? 0 : w->waiting_pulls();
}

void Shard::AwaitWaitingPulls(int32_t worker_id, uint32_t n) {
  uint32_t last = 0;
  const absl::Status s = testing::WaitFor(
      [&] {
        absl::StatusOr<StatusResponse> st = GetStatus(stub.get());
        if (!st.ok()) return false;
        const WorkerStatus* w = FindWorker(*st, worker_id);
        last = w == nullptr ? 0 : w->waiting_pulls();
        return last == n;
      },
      kEventDeadline,
      absl::StrCat("worker ", worker_id, " waiting_pulls == ", n));
  INFO("last seen " << last << "; server log:\n" << server.process->LogTail());
  REQUIRE_OK(s);
}

void Shard::Stop() {
  stub.reset();
  // Without connected clients it stops in milliseconds; the grace only
  // bounds a hang.
  absl::StatusOr<int> code = server.process->Kill(absl::Seconds(30));
  INFO("server log:\n" << server.process->LogTail());
  REQUIRE_OK(code.status());
  CHECK(*code == 0);
}

Shard StartOneShard(const std::vector<std::string>& flags) {
  absl::StatusOr<testing::ServerProcess> server = StartShard(flags);
  REQUIRE_OK(server.status());
  Shard shard{*std::move(server), nullptr};
  shard.stub = ParameterServer::NewStub(MakeChannel(shard.address()));
  return shard;
}

}  // namespace staleness
}  // namespace asyncps
