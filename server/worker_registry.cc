#include "server/worker_registry.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace asyncps {

namespace {

constexpr int64_t kNoLiveWorker = std::numeric_limits<int64_t>::max();

std::string Hex(uint64_t incarnation) {
  return absl::StrFormat("%016x", incarnation);
}

}  // namespace

absl::Status CheckWorkerRef(const WorkerRef& ref) {
  if (ref.worker_id() < 0 || ref.incarnation() == 0 || ref.clock() < 0 ||
      ref.trained() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "malformed worker reference: needs worker_id >= 0, incarnation != 0, "
        "clock >= 0, trained >= 0; got worker_id ",
        ref.worker_id(), ", incarnation ", ref.incarnation(), ", clock ",
        ref.clock(), ", trained ", ref.trained()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<WorkerRegistry>> WorkerRegistry::Create(
    RegistryOptions options) {
  if (options.logger == nullptr) {
    return absl::InvalidArgumentError("RegistryOptions.logger is required");
  }
  if (options.clock == nullptr) {
    return absl::InvalidArgumentError("RegistryOptions.clock is required");
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
  if (options.retired_incarnations < 1 || options.dedup_window < 1) {
    return absl::InvalidArgumentError(
        "retired_incarnations and dedup_window must be >= 1");
  }
  const bool thread = options.background_thread;
  std::unique_ptr<WorkerRegistry> registry(
      new WorkerRegistry(std::move(options)));
  if (thread) {
    registry->background_ =
        std::thread([r = registry.get()] { r->BackgroundLoop(); });
  }
  return registry;
}

WorkerRegistry::WorkerRegistry(RegistryOptions options)
    : options_(std::move(options)),
      slack_(options_.consistency == ASP   ? -1
             : options_.consistency == BSP ? 0
                                           : options_.ssp_slack) {}

WorkerRegistry::~WorkerRegistry() { Shutdown(); }

WorkerRegistry::Worker* WorkerRegistry::FindOrAdd(int32_t worker_id) {
  {
    absl::ReaderMutexLock l(&map_mu_);
    auto it = workers_.find(worker_id);
    if (it != workers_.end()) return it->second.get();
  }
  absl::MutexLock l(&map_mu_);
  auto& slot = workers_[worker_id];
  if (slot == nullptr) {
    slot = std::make_unique<Worker>(worker_id, options_.dedup_window);
  }
  return slot.get();
}

std::vector<WorkerRegistry::Worker*> WorkerRegistry::AllWorkers() const {
  absl::ReaderMutexLock l(&map_mu_);
  std::vector<Worker*> out;
  out.reserve(workers_.size());
  for (const auto& [id, w] : workers_) out.push_back(w.get());
  std::sort(out.begin(), out.end(),
            [](const Worker* a, const Worker* b) { return a->id < b->id; });
  return out;
}

int64_t WorkerRegistry::MinLiveClockExcept(const Worker* except) const {
  absl::ReaderMutexLock l(&map_mu_);
  int64_t min_clock = kNoLiveWorker;
  for (const auto& [id, w] : workers_) {
    if (w.get() == except || !w->live.load()) continue;
    min_clock = std::min(min_clock, w->clock.load());
  }
  return min_clock;
}

int64_t WorkerRegistry::MinLiveClock() const {
  return MinLiveClockExcept(nullptr);
}

std::string WorkerRegistry::LiveWorkersBelow(int64_t clock) const {
  constexpr int kNamed = 8;
  std::vector<std::string> named;
  int behind = 0;
  absl::ReaderMutexLock l(&map_mu_);
  for (const auto& [id, w] : workers_) {
    if (!w->live.load() || w->clock.load() >= clock) continue;
    if (++behind <= kNamed) {
      named.push_back(
          absl::StrCat("worker ", id, " at clock ", w->clock.load()));
    }
  }
  std::sort(named.begin(), named.end());
  if (behind > kNamed) named.push_back(absl::StrCat(behind - kNamed, " more"));
  return named.empty() ? "none" : absl::StrJoin(named, ", ");
}

void WorkerRegistry::RetireCurrent(Worker* w) {
  AddRetired(w, {w->incarnation});
  w->dedup = DedupWindow(options_.dedup_window);
  w->moved_seqs.clear();
  ++w->restarts;
  restarts_.fetch_add(1, std::memory_order_relaxed);
  w->fenced_logged = false;
}

absl::StatusOr<WorkerRegistry::Admission> WorkerRegistry::AdmitLocked(
    Worker* w, const WorkerRef& ref) {
  Admission a;
  const int64_t current = w->clock.load();
  if (ref.incarnation() == w->incarnation) {
    if (!w->live.load()) {
      options_.logger->info("worker {} rejoined at clock {}", w->id,
                            std::max(current, ref.clock()));
    }
    w->clock.store(std::max(current, ref.clock()));
  } else if (std::find(w->retired.begin(), w->retired.end(),
                       ref.incarnation()) != w->retired.end()) {
    fenced_.fetch_add(1, std::memory_order_relaxed);
    if (!w->fenced_logged) {
      w->fenced_logged = true;
      options_.logger->warn(
          "refusing calls of worker {} incarnation {}: replaced by "
          "incarnation {}",
          w->id, Hex(ref.incarnation()), Hex(w->incarnation));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", w->id, " incarnation ", Hex(ref.incarnation()),
        " was replaced by incarnation ", Hex(w->incarnation),
        " (a newer process of this worker id); this process must stop"));
  } else {
    // A process this registry has not seen: the first of this worker id, or
    // a restart that replaces the current one.
    const int64_t others = MinLiveClockExcept(w);
    const int64_t floor = others == kNoLiveWorker ? 0 : others;
    a.new_incarnation = true;
    if (w->incarnation == 0) {
      w->clock.store(std::max(ref.clock(), floor));
      options_.logger->info("worker {} joined (incarnation {}, clock {})",
                            w->id, Hex(ref.incarnation()), w->clock.load());
    } else {
      a.previous_clock = current;
      RetireCurrent(w);
      w->clock.store(std::max({ref.clock(), current, floor}));
      options_.logger->info(
          "worker {} restarted: incarnation {} replaces {}; resumes at clock "
          "{} (previous incarnation reached {})",
          w->id, Hex(ref.incarnation()), Hex(w->incarnation), w->clock.load(),
          current);
    }
    w->incarnation = ref.incarnation();
  }
  w->live.store(true);
  w->left = false;
  w->last_seen_ns.store(absl::ToUnixNanos(options_.clock->Now()));
  w->trained = std::max(w->trained, ref.trained());
  a.clock = w->clock.load();
  a.trained = w->trained;
  return a;
}

bool WorkerRegistry::IsCurrent(const WorkerRef& ref) const {
  Worker* w = nullptr;
  {
    absl::ReaderMutexLock l(&map_mu_);
    auto it = workers_.find(ref.worker_id());
    if (it == workers_.end()) return false;
    w = it->second.get();
  }
  absl::MutexLock l(&w->mu);
  return w->incarnation != 0 && w->incarnation == ref.incarnation();
}

absl::StatusOr<WorkerRegistry::Admission> WorkerRegistry::Admit(
    const WorkerRef& ref) {
  absl::Status s = CheckWorkerRef(ref);
  if (!s.ok()) return s;
  Worker* w = FindOrAdd(ref.worker_id());
  absl::StatusOr<Admission> a;
  {
    absl::MutexLock l(&w->mu);
    a = AdmitLocked(w, ref);
  }
  if (a.ok()) ReleaseWaiters();
  return a;
}

absl::Status WorkerRegistry::Leave(const WorkerRef& ref) {
  absl::Status s = CheckWorkerRef(ref);
  if (!s.ok()) return s;
  Worker* w = FindOrAdd(ref.worker_id());
  {
    absl::MutexLock l(&w->mu);
    absl::StatusOr<Admission> a = AdmitLocked(w, ref);
    if (!a.ok()) return a.status();
    w->live.store(false);
    w->left = true;
    options_.logger->info("worker {} left at clock {}", w->id, w->clock.load());
  }
  ReleaseWaiters();
  return absl::OkStatus();
}

DedupWindow::State WorkerRegistry::OriginsState(
    Worker* w, absl::Span<const PushOriginRef> moved_from,
    uint64_t* busy) const {
  DedupWindow::State state = DedupWindow::State::kNew;
  for (const PushOriginRef& o : moved_from) {
    if (o.shard == options_.shard_index) {
      // Sent here before, under an older map: this shard's own window.
      const DedupWindow::State own = w->dedup.Check(o.seq);
      if (own == DedupWindow::State::kApplied) return own;
      if (own == DedupWindow::State::kInFlight) {
        state = own;
        *busy = o.seq;
      }
      continue;
    }
    const auto it = w->moved_seqs.find(o.shard);
    if (it != w->moved_seqs.end() && it->second.Holds(o.seq)) {
      return DedupWindow::State::kApplied;
    }
  }
  return state;
}

absl::StatusOr<WorkerRegistry::PushClaim> WorkerRegistry::BeginPush(
    const WorkerRef& ref, uint64_t seq,
    absl::Span<const PushOriginRef> moved_from) {
  absl::Status s = CheckWorkerRef(ref);
  if (!s.ok()) return s;
  if (seq == 0) {
    return absl::InvalidArgumentError("push seq must be > 0");
  }
  Worker* w = FindOrAdd(ref.worker_id());
  PushClaim claim;
  bool advanced = false;
  {
    absl::MutexLock l(&w->mu);
    for (;;) {
      const int64_t before = w->clock.load();
      absl::StatusOr<Admission> a = AdmitLocked(w, ref);
      if (!a.ok()) return a.status();
      advanced = advanced || a->clock != before;
      uint64_t busy = seq;
      DedupWindow::State state = w->dedup.Check(seq);
      if (state == DedupWindow::State::kNew && !moved_from.empty()) {
        state = OriginsState(w, moved_from, &busy);
      }
      if (state == DedupWindow::State::kApplied) {
        claim.duplicate_ = true;
        break;
      }
      if (state == DedupWindow::State::kNew) {
        w->dedup.Begin(seq);
        claim.worker_ = w;
        claim.incarnation_ = ref.incarnation();
        claim.seq_ = seq;
        claim.clock_ = ref.clock();
        break;
      }
      // The same push (or an origin's part) is being applied by another
      // call: wait for it (or for this incarnation to be replaced), then
      // look again.
      const uint64_t incarnation = w->incarnation;
      auto settled = [w, busy,
                      incarnation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu) {
        return w->incarnation != incarnation ||
               w->dedup.Check(busy) != DedupWindow::State::kInFlight;
      };
      w->mu.Await(absl::Condition(&settled));
    }
  }
  if (advanced) ReleaseWaiters();
  return claim;
}

void WorkerRegistry::FinishPush(PushClaim* claim, bool applied) {
  if (claim->duplicate_ || claim->finished_ || claim->worker_ == nullptr) {
    return;
  }
  claim->finished_ = true;
  Worker* w = claim->worker_;
  {
    absl::MutexLock l(&w->mu);
    // A push of an incarnation replaced meanwhile changes nothing here: the
    // new incarnation has a window of its own.
    if (w->incarnation == claim->incarnation_) {
      if (applied) {
        w->dedup.Applied(claim->seq_);
        ++w->pushes;
        // After this push the worker has completed clock + 1 steps.
        w->clock.store(std::max(w->clock.load(), claim->clock_ + 1));
      } else {
        w->dedup.Abort(claim->seq_);
      }
    }
  }
  if (applied) ReleaseWaiters();
}

WorkerRegistry::WaitId WorkerRegistry::WhenReady(int32_t worker_id,
                                                 int64_t for_clock,
                                                 Callback done) {
  if (slack_ < 0) {  // ASP
    done(absl::OkStatus());
    return 0;
  }
  const int64_t required = for_clock - slack_;
  Worker* w = FindOrAdd(worker_id);
  // Counted before the clocks are read, so that a clock change racing this
  // registration sees the count and looks at the waiters.
  num_waiters_.fetch_add(1);
  absl::Status now_status;
  {
    absl::MutexLock l(&wait_mu_);
    if (shutdown_) {
      now_status = absl::UnavailableError("the shard is shutting down");
    } else if (MinLiveClock() < required) {
      const WaitId id = next_wait_id_++;
      w->waiting.fetch_add(1);
      waiters_.emplace(
          id, Waiter{w, required,
                     options_.clock->Now() + options_.pull_wait_timeout,
                     std::move(done)});
      return id;
    }
  }
  num_waiters_.fetch_sub(1);
  done(now_status);
  return 0;
}

void WorkerRegistry::CancelWait(WaitId id) {
  Callback done;
  {
    absl::MutexLock l(&wait_mu_);
    auto it = waiters_.find(id);
    if (it == waiters_.end()) return;
    done = std::move(it->second.done);
    it->second.worker->waiting.fetch_sub(1);
    waiters_.erase(it);
    num_waiters_.fetch_sub(1);
  }
  cancelled_.fetch_add(1, std::memory_order_relaxed);
  done(absl::CancelledError("the caller went away"));
}

void WorkerRegistry::CollectReadyLocked(Ready* ready) {
  if (waiters_.empty()) return;
  const int64_t min_clock = MinLiveClock();
  const absl::Time now = options_.clock->Now();
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    Waiter& waiter = it->second;
    if (waiter.required <= min_clock) {
      ready->emplace_back(std::move(waiter.done), absl::OkStatus());
    } else if (now >= waiter.deadline) {
      ready->emplace_back(
          std::move(waiter.done),
          absl::DeadlineExceededError(absl::StrCat(
              "pull waited ", absl::FormatDuration(options_.pull_wait_timeout),
              " for every live worker to reach clock ", waiter.required,
              "; behind: ", LiveWorkersBelow(waiter.required))));
    } else {
      ++it;
      continue;
    }
    waiter.worker->waiting.fetch_sub(1);
    num_waiters_.fetch_sub(1);
    waiters_.erase(it++);
  }
}

void WorkerRegistry::ReleaseWaiters() {
  if (num_waiters_.load() == 0) return;
  Ready ready;
  {
    absl::MutexLock l(&wait_mu_);
    CollectReadyLocked(&ready);
  }
  RunCallbacks(std::move(ready), /*on_executor=*/true);
}

void WorkerRegistry::RunCallbacks(Ready ready, bool on_executor) {
  for (auto& [done, status] : ready) {
    if (on_executor && options_.executor != nullptr) {
      options_.executor->Run([done = std::move(done),
                              status = std::move(status)]() { done(status); });
    } else {
      done(status);
    }
  }
}

void WorkerRegistry::Tick() {
  const absl::Time now = options_.clock->Now();
  const int64_t now_ns = absl::ToUnixNanos(now);
  for (Worker* w : AllWorkers()) {
    if (!w->live.load()) continue;
    if (w->waiting.load() > 0) {
      // A worker waiting in a pull is alive; its lease counts from when the
      // wait ends.
      w->last_seen_ns.store(now_ns);
      continue;
    }
    if (now - absl::FromUnixNanos(w->last_seen_ns.load()) <=
        options_.worker_lease) {
      continue;
    }
    absl::MutexLock l(&w->mu);
    const absl::Duration silent =
        now - absl::FromUnixNanos(w->last_seen_ns.load());
    if (!w->live.load() || silent <= options_.worker_lease ||
        w->waiting.load() > 0) {
      continue;
    }
    w->live.store(false);
    evictions_.fetch_add(1, std::memory_order_relaxed);
    options_.logger->warn(
        "worker {} evicted: silent for {} (lease {}), clock {}", w->id,
        absl::FormatDuration(silent),
        absl::FormatDuration(options_.worker_lease), w->clock.load());
  }
  // Evictions may release waits; deadlines may have passed.
  Ready ready;
  if (num_waiters_.load() > 0) {
    absl::MutexLock l(&wait_mu_);
    CollectReadyLocked(&ready);
  }
  RunCallbacks(std::move(ready), /*on_executor=*/true);
}

void WorkerRegistry::BackgroundLoop() {
  // Ticks often enough to evict within ~1/8 of a lease and to time out waits
  // within ~10 ms of their deadline.
  const absl::Duration period =
      std::clamp(options_.worker_lease / 8, absl::Milliseconds(5),
                 absl::Milliseconds(250));
  for (;;) {
    {
      const absl::Duration wait =
          num_waiters_.load() == 0 ? period
                                   : std::min(period, absl::Milliseconds(10));
      if (stop_thread_.WaitForNotificationWithTimeout(wait)) return;
    }
    Tick();
  }
}

void WorkerRegistry::Shutdown() {
  Ready ready;
  {
    absl::MutexLock l(&wait_mu_);
    shutdown_ = true;
    for (auto& [id, waiter] : waiters_) {
      waiter.worker->waiting.fetch_sub(1);
      num_waiters_.fetch_sub(1);
      ready.emplace_back(std::move(waiter.done),
                         absl::UnavailableError("the shard is shutting down"));
    }
    waiters_.clear();
  }
  RunCallbacks(std::move(ready), /*on_executor=*/false);
  stop_thread_.Notify();
  if (background_.joinable() &&
      background_.get_id() != std::this_thread::get_id()) {
    background_.join();
  }
}

std::vector<WorkerInfo> WorkerRegistry::Workers() const {
  std::vector<WorkerInfo> out;
  const absl::Time now = options_.clock->Now();
  for (Worker* w : AllWorkers()) {
    absl::MutexLock l(&w->mu);
    if (w->incarnation == 0) continue;  // never admitted
    WorkerInfo info;
    info.worker_id = w->id;
    info.incarnation = w->incarnation;
    info.clock = w->clock.load();
    info.silent_for = now - absl::FromUnixNanos(w->last_seen_ns.load());
    info.pushes = w->pushes;
    info.live = w->live.load();
    info.left = w->left;
    info.restarts = w->restarts;
    info.waiting_pulls = static_cast<uint32_t>(std::max(0, w->waiting.load()));
    info.trained = w->trained;
    out.push_back(info);
  }
  return out;
}

RegistryCounters WorkerRegistry::counters() const {
  RegistryCounters c;
  c.evictions = evictions_.load(std::memory_order_relaxed);
  c.fenced_calls = fenced_.load(std::memory_order_relaxed);
  c.restarts = restarts_.load(std::memory_order_relaxed);
  c.cancelled_pulls = cancelled_.load(std::memory_order_relaxed);
  return c;
}

int64_t WorkerRegistry::waiting() const {
  absl::MutexLock l(&wait_mu_);
  return static_cast<int64_t>(waiters_.size());
}

std::vector<CheckpointWorker> WorkerRegistry::Export() const {
  std::vector<CheckpointWorker> out;
  for (Worker* w : AllWorkers()) {
    absl::MutexLock l(&w->mu);
    if (w->incarnation == 0) continue;
    CheckpointWorker r;
    r.set_worker_id(w->id);
    r.set_incarnation(w->incarnation);
    for (uint64_t inc : w->retired) r.add_retired_incarnations(inc);
    r.set_clock(w->clock.load());
    r.set_pushes(w->pushes);
    r.set_restarts(w->restarts);
    r.set_left(w->left);
    r.set_trained(w->trained);
    r.set_dedup_base(w->dedup.base());
    for (uint64_t seq : w->dedup.AppliedAboveBase()) r.add_dedup_applied(seq);
    for (const auto& [shard, seqs] : w->moved_seqs) {
      seqs.ToProto(shard, r.add_moved_seqs());
    }
    out.push_back(std::move(r));
  }
  return out;
}

absl::Status WorkerRegistry::Import(
    const std::vector<CheckpointWorker>& records) {
  for (const CheckpointWorker& r : records) {
    if (r.worker_id() < 0 || r.incarnation() == 0 || r.clock() < 0 ||
        r.trained() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker record of id ", r.worker_id(), " incarnation ",
                       r.incarnation(), " clock ", r.clock(), " is malformed"));
    }
    Worker* w = FindOrAdd(r.worker_id());
    absl::MutexLock l(&w->mu);
    if (w->incarnation != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker ", r.worker_id(), " is already registered"));
    }
    w->incarnation = r.incarnation();
    w->retired.assign(r.retired_incarnations().begin(),
                      r.retired_incarnations().end());
    w->clock.store(r.clock());
    w->pushes = r.pushes();
    w->restarts = r.restarts();
    w->trained = r.trained();
    w->left = r.left();
    w->dedup.Import(r.dedup_base(),
                    std::vector<uint64_t>(r.dedup_applied().begin(),
                                          r.dedup_applied().end()));
    for (const AppliedSeqs& seqs : r.moved_seqs()) {
      w->moved_seqs[seqs.shard()].Merge(AppliedSeqSet::FromProto(seqs));
    }
    // Restored workers count as live from now (those that are gone are
    // evicted after a lease), so that SSP/BSP waits keep their meaning.
    w->live.store(!r.left());
    w->last_seen_ns.store(absl::ToUnixNanos(options_.clock->Now()));
  }
  return absl::OkStatus();
}

}  // namespace asyncps
