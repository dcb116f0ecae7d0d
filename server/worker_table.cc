#include "server/worker_table.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace asyncps {

namespace {
constexpr int64_t kNoLiveWorker = std::numeric_limits<int64_t>::max();
}  // namespace

absl::StatusOr<std::unique_ptr<WorkerTable>> WorkerTable::Create(
    ConsistencyOptions options) {
  if (options.logger == nullptr) {
    return absl::InvalidArgumentError("ConsistencyOptions.logger is required");
  }
  if (options.consistency == SSP && options.ssp_slack < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ssp_slack must be >= 0, got ", options.ssp_slack));
  }
  if (options.worker_lease <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("worker lease must be > 0");
  }
  if (options.pull_wait_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("pull wait timeout must be > 0");
  }
  auto table = std::unique_ptr<WorkerTable>(new WorkerTable(std::move(options)));
  table->background_ = std::thread([t = table.get()] { t->BackgroundLoop(); });
  return table;
}

WorkerTable::WorkerTable(ConsistencyOptions options)
    : options_(std::move(options)),
      slack_(options_.consistency == ASP   ? -1
             : options_.consistency == BSP ? 0
                                           : options_.ssp_slack) {}

WorkerTable::~WorkerTable() { Shutdown(); }

absl::StatusOr<WorkerInfo*> WorkerTable::FindOrAddLocked(
    const WorkerRef& worker) {
  if (worker.worker_id() < 0 || worker.incarnation() == 0 ||
      worker.clock() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ref needs worker_id >= 0, incarnation > 0, clock >= 0; got id ",
        worker.worker_id(), ", incarnation ", worker.incarnation(), ", clock ",
        worker.clock()));
  }
  const absl::Time now = options_.now();
  auto [it, inserted] = workers_.try_emplace(worker.worker_id());
  WorkerInfo& w = it->second;
  if (inserted || worker.incarnation() > w.incarnation) {
    if (!inserted) {
      options_.logger->info("worker {} restarted (incarnation {} -> {})",
                            worker.worker_id(), w.incarnation,
                            worker.incarnation());
    } else {
      options_.logger->info("worker {} joined (incarnation {}, clock {})",
                            worker.worker_id(), worker.incarnation(),
                            worker.clock());
    }
    const uint64_t pushes = inserted ? 0 : w.pushes;
    w = WorkerInfo{};
    w.worker_id = worker.worker_id();
    w.incarnation = worker.incarnation();
    w.clock = worker.clock();
    w.pushes = pushes;
  } else if (worker.incarnation() < w.incarnation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", worker.worker_id(), " incarnation ", worker.incarnation(),
        " is older than the live incarnation ", w.incarnation));
  }
  if (!w.live) {
    options_.logger->info("worker {} rejoined at clock {}", w.worker_id,
                          std::max(w.clock, worker.clock()));
  }
  w.live = true;
  w.left = false;
  w.last_seen = now;
  return &w;
}

absl::Status WorkerTable::Touch(const WorkerRef& worker, int64_t clock,
                                bool push) {
  std::vector<std::pair<Callback, absl::Status>> ready;
  {
    absl::MutexLock l(&mu_);
    absl::StatusOr<WorkerInfo*> w = FindOrAddLocked(worker);
    if (!w.ok()) return w.status();
    (*w)->clock = std::max((*w)->clock, clock);
    if (push) ++(*w)->pushes;
    CollectReadyLocked(&ready);
  }
  for (auto& [done, status] : ready) done(status);
  return absl::OkStatus();
}

absl::Status WorkerTable::Leave(const WorkerRef& worker) {
  std::vector<std::pair<Callback, absl::Status>> ready;
  {
    absl::MutexLock l(&mu_);
    absl::StatusOr<WorkerInfo*> w = FindOrAddLocked(worker);
    if (!w.ok()) return w.status();
    (*w)->clock = std::max((*w)->clock, worker.clock());
    (*w)->live = false;
    (*w)->left = true;
    options_.logger->info("worker {} left at clock {}", (*w)->worker_id,
                          (*w)->clock);
    CollectReadyLocked(&ready);
  }
  for (auto& [done, status] : ready) done(status);
  return absl::OkStatus();
}

bool WorkerTable::WhenReady(int32_t worker_id, int64_t clock, Callback done) {
  if (slack_ < 0) {  // ASP
    done(absl::OkStatus());
    return false;
  }
  const int64_t required = clock - slack_;
  absl::Status now_status = absl::OkStatus();
  {
    absl::MutexLock l(&mu_);
    if (shutdown_) {
      now_status = absl::UnavailableError("server is shutting down");
    } else if (MinLiveClockLocked() < required) {
      waiters_.push_back(Waiter{worker_id, required,
                                options_.now() + options_.pull_wait_timeout,
                                std::move(done)});
      return true;
    }
  }
  done(now_status);
  return false;
}

int64_t WorkerTable::MinLiveClockLocked() const {
  int64_t min_clock = kNoLiveWorker;
  for (const auto& [id, w] : workers_) {
    if (w.live) min_clock = std::min(min_clock, w.clock);
  }
  return min_clock;
}

int64_t WorkerTable::MinLiveClock() const {
  absl::ReaderMutexLock l(&mu_);
  return MinLiveClockLocked();
}

void WorkerTable::CollectReadyLocked(
    std::vector<std::pair<Callback, absl::Status>>* ready) {
  if (waiters_.empty()) return;
  const int64_t min_clock = MinLiveClockLocked();
  const absl::Time now = options_.now();
  auto keep = std::partition(waiters_.begin(), waiters_.end(),
                             [&](const Waiter& w) {
                               return w.required > min_clock && now < w.deadline;
                             });
  for (auto it = keep; it != waiters_.end(); ++it) {
    if (it->required <= min_clock) {
      ready->emplace_back(std::move(it->done), absl::OkStatus());
    } else {
      ready->emplace_back(
          std::move(it->done),
          absl::DeadlineExceededError(absl::StrCat(
              "pull waited ", absl::FormatDuration(options_.pull_wait_timeout),
              " for the slowest live worker to reach clock ", it->required,
              " (it is at ", min_clock, ")")));
    }
  }
  waiters_.erase(keep, waiters_.end());
}

void WorkerTable::Tick() {
  std::vector<std::pair<Callback, absl::Status>> ready;
  {
    absl::MutexLock l(&mu_);
    const absl::Time now = options_.now();
    for (const Waiter& waiter : waiters_) {
      auto it = workers_.find(waiter.worker_id);
      if (it != workers_.end()) it->second.last_seen = now;
    }
    for (auto& [id, w] : workers_) {
      if (w.live && now - w.last_seen > options_.worker_lease) {
        w.live = false;
        ++evictions_;
        options_.logger->warn(
            "worker {} evicted: silent for {} (lease {}), clock {}", id,
            absl::FormatDuration(now - w.last_seen),
            absl::FormatDuration(options_.worker_lease), w.clock);
      }
    }
    CollectReadyLocked(&ready);
  }
  for (auto& [done, status] : ready) done(status);
}

void WorkerTable::BackgroundLoop() {
  // Ticks often enough to evict within ~1/8 of a lease and to time out waits
  // within ~10 ms of their deadline.
  const absl::Duration period = std::clamp(options_.worker_lease / 8,
                                           absl::Milliseconds(5),
                                           absl::Milliseconds(250));
  for (;;) {
    {
      absl::MutexLock l(&mu_);
      const absl::Duration wait =
          waiters_.empty() ? period : std::min(period, absl::Milliseconds(10));
      mu_.AwaitWithTimeout(absl::Condition(&shutdown_), wait);
      if (shutdown_) return;
    }
    Tick();
  }
}

void WorkerTable::Shutdown() {
  std::vector<Waiter> waiters;
  {
    absl::MutexLock l(&mu_);
    if (shutdown_ && !background_.joinable()) return;
    shutdown_ = true;
    waiters.swap(waiters_);
  }
  for (Waiter& w : waiters) {
    w.done(absl::UnavailableError("server is shutting down"));
  }
  if (background_.joinable() &&
      background_.get_id() != std::this_thread::get_id()) {
    background_.join();
  }
}

std::vector<WorkerInfo> WorkerTable::Workers() const {
  absl::ReaderMutexLock l(&mu_);
  std::vector<WorkerInfo> out;
  for (const auto& [id, w] : workers_) out.push_back(w);
  std::sort(out.begin(), out.end(), [](const WorkerInfo& a, const WorkerInfo& b) {
    return a.worker_id < b.worker_id;
  });
  return out;
}

uint64_t WorkerTable::evictions() const {
  absl::ReaderMutexLock l(&mu_);
  return evictions_;
}

int64_t WorkerTable::waiting() const {
  absl::ReaderMutexLock l(&mu_);
  return static_cast<int64_t>(waiters_.size());
}

}  // namespace asyncps
