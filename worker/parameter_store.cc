#include "worker/parameter_store.h"

#include <algorithm>

namespace asyncps {
namespace {

class RemoteStore : public ParameterStore {
 public:
  explicit RemoteStore(std::unique_ptr<PsClient> client)
      : client_(std::move(client)) {}

  absl::Status Create(const std::vector<TensorSpec>& tensors,
                      const std::vector<TableSpec>& tables) override {
    absl::Status s = client_->CreateTensors(tensors);
    if (s.ok()) s = client_->CreateTables(tables);
    return s;
  }
  absl::Status WaitFor(const std::vector<std::string>& names,
                       absl::Duration timeout) override {
    return client_->WaitForTensors(names, timeout);
  }
  absl::StatusOr<Registration> Register() override {
    return client_->Register();
  }
  std::unique_ptr<PendingPull> StartPull(int64_t clock, int64_t for_clock,
                                         const PullSet& what) override {
    return std::make_unique<RemotePull>(
        client_->StartPull(clock, for_clock, what));
  }
  std::unique_ptr<PendingPush> StartPush(int64_t clock, const PushSet& what,
                                         const ReadSet& read) override {
    return std::make_unique<RemotePush>(client_->StartPush(clock, what, read));
  }
  Step StartStep(int64_t clock, const PushSet& push, const ReadSet& read,
                 const PullSet& next) override {
    PsClient::PendingStep both = client_->StartStep(clock, push, read, next);
    Step step;
    step.push = std::make_unique<RemotePush>(std::move(both.push));
    step.pull = std::make_unique<RemotePull>(std::move(both.pull));
    return step;
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

ShareStart StartShare(const Registration& reg, int64_t total_steps,
                      int worker_id, spdlog::logger& logger) {
  ShareStart start;
  start.step = std::min(total_steps, reg.trained);
  if (reg.trained >= total_steps) {
    start.already_trained = true;
    logger.warn(
        "nothing to train: an earlier process of worker {} trained its "
        "whole share ({} of {} steps) in this run",
        worker_id, reg.trained, total_steps);
  } else if (reg.trained > 0 || reg.previous_clock > 0) {
    logger.info(
        "resuming at step {} of {} at clock {}: an earlier process of "
        "worker {} trained {} steps (its clock reached {})",
        start.step, total_steps, reg.resume_clock, worker_id, reg.trained,
        reg.previous_clock);
  } else if (reg.resume_clock > 0) {
    logger.info(
        "joining at clock {}, the slowest live worker's; training the share "
        "from step 0",
        reg.resume_clock);
  }
  return start;
}

absl::Status WaitForOtherWorkers(ParameterStore* store, absl::Duration timeout,
                                 Clock* clock, const std::atomic<bool>* stop,
                                 spdlog::logger& logger) {
  constexpr absl::Duration kPoll = absl::Milliseconds(200);
  constexpr absl::Duration kReport = absl::Seconds(10);
  const absl::Time start = clock->Now();
  absl::Time last_report = start;
  for (;;) {
    absl::StatusOr<int> live = store->LiveWorkers();
    if (!live.ok()) return live.status();
    if (*live == 0 || (stop != nullptr && stop->load())) {
      return absl::OkStatus();
    }
    const absl::Time now = clock->Now();
    if (now - start > timeout) {
      logger.warn("{} worker(s) still training after {}; evaluating now", *live,
                  absl::FormatDuration(timeout));
      return absl::OkStatus();
    }
    if (now - last_report >= kReport) {
      last_report = now;
      logger.info(
          "final evaluation waits for {} worker(s) still training ({} of {})",
          *live,
          absl::FormatDuration(absl::Trunc(now - start, absl::Seconds(1))),
          absl::FormatDuration(timeout));
    }
    absl::SleepFor(kPoll);
  }
}

}  // namespace asyncps
