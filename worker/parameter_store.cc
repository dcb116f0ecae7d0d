#include "worker/parameter_store.h"

#include <algorithm>

namespace asyncps {
namespace {

class RemotePull : public ParameterStore::PendingPull {
 public:
  explicit RemotePull(std::unique_ptr<PsClient::PendingPull> p)
      : p_(std::move(p)) {}
  absl::Status Wait() override { return p_->Wait(); }
  const ReadSet& read() const override { return p_->read(); }

 private:
  std::unique_ptr<PsClient::PendingPull> p_;
};

class RemotePush : public ParameterStore::PendingPush {
 public:
  explicit RemotePush(std::unique_ptr<PsClient::PendingPush> p)
      : p_(std::move(p)) {}
  absl::StatusOr<PushSummary> Wait() override { return p_->Wait(); }

 private:
  std::unique_ptr<PsClient::PendingPush> p_;
};

class RemoteStore : public ParameterStore {
 public:
  explicit RemoteStore(std::unique_ptr<PsClient> client)
      : client_(std::move(client)) {}

  absl::Status Create(const std::vector<TensorSpec>& specs) override {
    return client_->CreateTensors(specs);
  }
  absl::Status WaitFor(const std::vector<std::string>& names,
                       absl::Duration timeout) override {
    return client_->WaitForTensors(names, timeout);
  }
  absl::StatusOr<Registration> Register() override {
    return client_->Register();
  }
  std::unique_ptr<PendingPull> StartPull(
      int64_t clock, int64_t for_clock,
      const std::vector<std::pair<std::string, float*>>& outs) override {
    return std::make_unique<RemotePull>(
        client_->StartPull(clock, for_clock, outs));
  }
  std::unique_ptr<PendingPush> StartPush(
      int64_t clock,
      const std::vector<std::pair<std::string, const float*>>& grads,
      const ReadSet& read) override {
    return std::make_unique<RemotePush>(client_->StartPush(clock, grads, read));
  }
  absl::Status Heartbeat(int64_t clock, bool leaving) override {
    return client_->Heartbeat(clock, leaving);
  }
  void ReportTrained(int64_t steps) override { client_->ReportTrained(steps); }
  absl::StatusOr<int> LiveWorkers() override {
    absl::StatusOr<std::vector<StatusResponse>> status = client_->Status();
    if (!status.ok()) return status.status();
    int live = 0;
    for (const StatusResponse& shard : *status) {
      int n = 0;
      for (const WorkerStatus& w : shard.workers()) n += w.live() ? 1 : 0;
      live = std::max(live, n);
    }
    return live;
  }

 private:
  std::unique_ptr<PsClient> client_;
};

}  // namespace

std::unique_ptr<ParameterStore> MakeRemoteStore(
    std::unique_ptr<PsClient> client) {
  return std::make_unique<RemoteStore>(std::move(client));
}

}  // namespace asyncps
