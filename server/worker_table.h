#ifndef ASYNCPS_SERVER_WORKER_TABLE_H_
#define ASYNCPS_SERVER_WORKER_TABLE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/asyncps.pb.h"
#include "spdlog/spdlog.h"

namespace asyncps {

// The read-side consistency model and worker liveness.
struct ConsistencyOptions {
  Consistency consistency = ASP;
  int64_t ssp_slack = 0;  // SSP only; BSP is slack 0
  // A worker silent for longer than this is evicted from the clock
  // computation until it speaks again.
  absl::Duration worker_lease = absl::Seconds(10);
  // Longest a pull waits for slow workers before DEADLINE_EXCEEDED.
  absl::Duration pull_wait_timeout = absl::Seconds(60);
  // Injected clock (tests use a fake one).
  std::function<absl::Time()> now = absl::Now;
  std::shared_ptr<spdlog::logger> logger;  // required
};

// One worker as the table sees it.
struct WorkerInfo {
  int32_t worker_id = 0;
  uint64_t incarnation = 0;
  int64_t clock = 0;
  absl::Time last_seen;
  uint64_t pushes = 0;
  bool live = true;
  bool left = false;
};

// Tracks every worker that talks to this shard: incarnation, clock (steps
// completed), lease; and gates pulls by the consistency model:
//   ASP: never wait;
//   SSP(s): a pull at clock c is answered once every live worker's clock is
//           >= c - s (Ho et al. 2013);
//   BSP: SSP with s = 0.
// A worker that is silent longer than its lease, or that said it is leaving,
// is not live and does not hold anyone back; any later call makes it live
// again (it rejoins).
//
// Waiting pulls do not hold a thread: WhenReady stores a callback that runs
// when the condition holds, when the pull's wait times out, or at Shutdown.
// A background thread expires leases and wait deadlines.
//
// Thread-safe. Callbacks run without the table's lock held, on the thread
// that made the condition true (a push, heartbeat or the background thread).
class WorkerTable {
 public:
  using Callback = std::function<void(absl::Status)>;

  static absl::StatusOr<std::unique_ptr<WorkerTable>> Create(
      ConsistencyOptions options);
  ~WorkerTable();  // calls Shutdown()

  // Records that `worker` is alive at clock `clock` (clocks only move
  // forward within an incarnation; a newer incarnation replaces the record).
  // `push` counts a push. FAILED_PRECONDITION for an incarnation older than
  // the one known; INVALID_ARGUMENT for a malformed WorkerRef.
  absl::Status Touch(const WorkerRef& worker, int64_t clock, bool push);

  // The worker is done: it stops counting for the slowest clock.
  absl::Status Leave(const WorkerRef& worker);

  // Runs done(OK) once a pull by `worker_id` at `clock` may be answered
  // under the consistency model: at once if it may be now. Otherwise done()
  // gets DEADLINE_EXCEEDED after pull_wait_timeout, or UNAVAILABLE at
  // Shutdown. A worker waiting in a pull is alive: its lease does not expire
  // while it waits. Returns whether the pull had to wait.
  bool WhenReady(int32_t worker_id, int64_t clock, Callback done);

  // Evicts workers whose lease expired and times out waits; the background
  // thread calls this, tests with a fake clock may call it directly.
  void Tick();

  // Fails every waiting pull with UNAVAILABLE and stops the background
  // thread. Idempotent.
  void Shutdown();

  std::vector<WorkerInfo> Workers() const;
  int64_t MinLiveClock() const;  // INT64_MAX when no worker is live
  uint64_t evictions() const;
  int64_t waiting() const;
  const ConsistencyOptions& options() const { return options_; }

 private:
  struct Waiter {
    int32_t worker_id;
    int64_t required;  // min live clock needed
    absl::Time deadline;
    Callback done;
  };

  explicit WorkerTable(ConsistencyOptions options);
  int64_t MinLiveClockLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Moves the waiters that may run now (or timed out) into `ready`.
  void CollectReadyLocked(std::vector<std::pair<Callback, absl::Status>>* ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<WorkerInfo*> FindOrAddLocked(const WorkerRef& worker)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void BackgroundLoop();

  const ConsistencyOptions options_;
  const int64_t slack_;  // -1 for ASP

  mutable absl::Mutex mu_;
  absl::flat_hash_map<int32_t, WorkerInfo> workers_ ABSL_GUARDED_BY(mu_);
  std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  uint64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  std::thread background_;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_WORKER_TABLE_H_
