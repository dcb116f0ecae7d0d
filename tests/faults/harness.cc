#include "tests/faults/harness.h"

#include <grpcpp/grpcpp.h>

#include <regex>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/net.h"
#include "proto/asyncps.grpc.pb.h"

namespace asyncps {
namespace testing {

absl::StatusOr<std::unique_ptr<Subprocess>> StartWorker(
    std::vector<std::string> args) {
  args.push_back(absl::StrCat("--data_dir=", kFashionMnist));
  return Subprocess::Start(RunfilePath("worker/ps_worker"), args);
}

double FinalAccuracy(const std::string& log) {
  std::smatch m;
  static const std::regex re("final test accuracy: ([0-9.]+)");
  return std::regex_search(log, m, re) ? std::stod(m[1]) : -1.0;
}

absl::Status WaitForLog(Subprocess* process, absl::string_view needle,
                        absl::Duration timeout) {
  return WaitForAnyLog({process}, needle, timeout);
}

absl::Status WaitForAnyLog(const std::vector<Subprocess*>& processes,
                           absl::string_view needle, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    bool running = false;
    for (Subprocess* process : processes) {
      if (absl::StrContains(process->ReadLog(), needle)) {
        return absl::OkStatus();
      }
      running |= process->Running();
    }
    if (!running) {
      return absl::FailedPreconditionError(
          absl::StrCat(processes.front()->command_line(), " (and ",
                       processes.size() - 1, " more) exited before logging '",
                       needle, "':\n", processes.front()->LogTail()));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no '", needle, "' in the log of ", processes.front()->command_line(),
          " (and ", processes.size() - 1, " more) after ",
          absl::FormatDuration(timeout), ":\n", processes.front()->LogTail()));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

absl::StatusOr<StatusResponse> ShardStatus(const std::string& address) {
  // One channel per address for the whole test: polling opens no new
  // connections.
  static absl::Mutex mu;
  static auto* stubs =
      new absl::flat_hash_map<std::string,
                              std::shared_ptr<ParameterServer::Stub>>();
  std::shared_ptr<ParameterServer::Stub> stub;
  {
    absl::MutexLock l(&mu);
    auto& slot = (*stubs)[address];
    if (slot == nullptr) slot = ParameterServer::NewStub(MakeChannel(address));
    stub = slot;
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  ctx.set_wait_for_ready(true);
  StatusResponse response;
  const grpc::Status s = stub->Status(&ctx, StatusRequest(), &response);
  if (!s.ok()) return FromGrpcStatus(s);
  return response;
}

const WorkerStatus* FindWorker(const StatusResponse& status, int worker_id) {
  for (const WorkerStatus& w : status.workers()) {
    if (w.worker_id() == worker_id) return &w;
  }
  return nullptr;
}

int PortOf(const std::string& address) {
  int port = 0;
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port)) {
    return 0;
  }
  return port;
}

}  // namespace testing
}  // namespace asyncps
