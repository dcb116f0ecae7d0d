#ifndef ASYNCPS_SERVER_WORKER_REGISTRY_H_
#define ASYNCPS_SERVER_WORKER_REGISTRY_H_

// The workers of one shard: every call goes through the WorkerRegistry.
// Admit checks who the caller is (fencing replaced processes) and moves its
// clock; BeginPush / FinishPush apply each push at most once; WhenReady
// answers a pull once ASP, SSP or BSP allows, without holding a thread.
//
// Example:
//
//   RegistryOptions options;
//   options.consistency = SSP;
//   options.ssp_slack = 2;
//   options.logger = logger;  // required
//   absl::StatusOr<std::unique_ptr<WorkerRegistry>> workers =
//       WorkerRegistry::Create(options);
//   if (!workers.ok()) return workers.status();
//
//   // A pull: admit the caller, answer when the slowest worker allows.
//   absl::StatusOr<WorkerRegistry::Admission> admitted =
//       (*workers)->Admit(pull.worker());
//   if (!admitted.ok()) return admitted.status();  // e.g. a fenced process
//   (*workers)->WhenReady(pull.worker().worker_id(), pull.worker().clock(),
//                         [](absl::Status s) { /* answer the pull */ });
//
//   // A push: claim its seq; apply it unless it was applied before.
//   absl::StatusOr<WorkerRegistry::PushClaim> claim =
//       (*workers)->BeginPush(push.worker(), push.seq());
//   if (!claim.ok()) return claim.status();
//   if (!claim->duplicate()) (*workers)->FinishPush(&*claim, Apply(push));

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
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
#include "absl/types/span.h"
#include "common/clock.h"
#include "common/executor.h"
#include "common/steady_wait.h"
#include "proto/asyncps.pb.h"
#include "proto/checkpoint.pb.h"
#include "server/applied_seq_set.h"
#include "server/dedup_window.h"
#include "spdlog/spdlog.h"

namespace asyncps {

struct RegistryOptions {
  Consistency consistency = ASP;
  int64_t ssp_slack = 0;  // SSP only; BSP is slack 0
  // A worker silent for longer than this is evicted from the clock
  // computation until it speaks again. A pull waiting on SSP/BSP keeps its
  // worker alive while its caller is there.
  absl::Duration worker_lease = absl::Seconds(10);
  // Longest a pull waits for slow workers before DEADLINE_EXCEEDED.
  absl::Duration pull_wait_timeout = absl::Seconds(60);
  // Replaced incarnations remembered per worker id (their calls are
  // refused); older ones are forgotten.
  int retired_incarnations = 16;
  // Push sequence numbers tracked per incarnation (see DedupWindow).
  int dedup_window = 4096;
  // This shard's index: the tag of its own window among the applied seqs a
  // move carries (MovedWorkerRecord::applied_seqs), and the origin of a
  // re-routed push part whose own window decides (BeginPush).
  uint32_t shard_index = 0;
  // Monotonic: worker leases and pull waits are durations, which a step of
  // the real-time clock must not end (a step forward evicted every worker).
  Clock* clock = Clock::Monotonic();  // not owned
  // Runs the callbacks of waiting pulls that another call released, so the
  // releasing call does not do their work. Null: run them on the releasing
  // thread. Not owned.
  Executor* executor = nullptr;
  // false: no background thread; the owner calls Tick() (tests with a fake
  // clock).
  bool background_thread = true;
  std::shared_ptr<spdlog::logger> logger;  // required
};

// INVALID_ARGUMENT naming the worker reference unless it is well formed
// (worker_id >= 0, incarnation != 0, clock >= 0, trained >= 0). A shard
// checks it before anything else of a request that names its caller (a
// push's or a pull's payload, tensors, rows), so that a malformed caller is
// told so whatever else the request holds.
absl::Status CheckWorkerRef(const WorkerRef& ref);

// One worker id as the registry sees it.
struct WorkerInfo {
  int32_t worker_id = 0;
  uint64_t incarnation = 0;
  int64_t clock = 0;
  absl::Duration silent_for;  // since it was last heard from
  uint64_t pushes = 0;
  bool live = true;
  bool left = false;
  uint32_t restarts = 0;
  uint32_t waiting_pulls = 0;
  int64_t trained = 0;  // data position (WorkerRef.trained)
};

// A worker's record as a live slot move carries it from the shard the
// slots leave to the one they go to (proto/slot_moves.proto MovedWorker),
// so that the destination's consistency waits know every worker's clock,
// and which of its pushes the source (and the shards whose slots it took
// before) had applied, so that a push part re-routed from there is applied
// exactly once. (Clients re-send the pushes a move refused under fresh
// sequence numbers; only a part whose answer was lost is re-routed.)
struct MovedWorkerRecord {
  int32_t worker_id = 0;
  uint64_t incarnation = 0;
  std::vector<uint64_t> retired;  // replaced incarnations, oldest first
  int64_t clock = 0;
  int64_t trained = 0;
  bool live = false;
  bool left = false;
  // By shard: the source's own window and those moves brought it, for
  // this incarnation.
  std::map<uint32_t, AppliedSeqSet> applied_seqs;
};

// Where a re-routed push part went before (PushRequest.moved_from).
struct PushOriginRef {
  uint32_t shard = 0;
  uint64_t seq = 0;
};

struct RegistryCounters {
  uint64_t evictions = 0;
  uint64_t fenced_calls = 0;
  uint64_t restarts = 0;
  uint64_t cancelled_pulls = 0;
};

// The one authority on the workers of a shard: who they are (worker id and
// incarnation, with fencing), where their clocks stand, whether they are
// alive, which of their pushes were applied (de-duplication), and the
// consistency model's waits:
//   ASP: never wait;
//   SSP(s): a pull for clock c is answered once every live worker's clock is
//           >= c - s (Ho et al. 2013);
//   BSP: SSP with s = 0.
//
// Identity. A worker id names a role, an incarnation one process of it.
// The first call of an incarnation the registry does not know replaces the
// current one (a restart): the old incarnation is retired and every later
// call of it is refused with FAILED_PRECONDITION before anything happens.
// Incarnations are opaque: never compared by size. A new incarnation's clock
// starts at the largest of its own, its predecessor's and the slowest other
// live worker's, so that it neither holds its peers back nor runs ahead.
//
// Data position. Apart from its clock, a worker id has a data position: the
// steps of its share whose pushes every shard acknowledged, as its processes
// report it (WorkerRef.trained). The registry keeps the largest reported for
// the id, across incarnations, and tells every caller (Admission.trained):
// a restarted process continues its share there, whatever clock it joins at.
//
// Liveness. A worker silent longer than its lease, or that said it is
// leaving, is not live and holds nobody back; any later call makes it live
// again. A pull waiting on the consistency model keeps its worker alive
// until it is answered or its caller goes away (CancelWait).
//
// Waiting pulls hold no thread: WhenReady stores a callback. A background
// thread expires leases and wait deadlines.
//
// Locking: each worker has its own lock, so calls of different workers do
// not contend; the worker map's lock is shared except to add a worker id;
// the waiters' lock is taken on a clock change only while some pull waits.
// Thread-safe. Callbacks run without any registry lock held.
class WorkerRegistry {
 private:
  // One worker id. Records are never removed (one per id ever seen).
  struct Worker {
    const int32_t id;
    explicit Worker(int32_t worker_id, int dedup_window)
        : id(worker_id), dedup(dedup_window) {}

    absl::Mutex mu;
    uint64_t incarnation ABSL_GUARDED_BY(mu) = 0;  // 0 until first admitted
    std::vector<uint64_t> retired ABSL_GUARDED_BY(mu);  // oldest first
    DedupWindow dedup ABSL_GUARDED_BY(mu);
    // Other shards' applied seqs of this incarnation, from the moves that
    // brought their slots here (directly or through other shards).
    std::map<uint32_t, AppliedSeqSet> moved_seqs ABSL_GUARDED_BY(mu);
    uint64_t pushes ABSL_GUARDED_BY(mu) = 0;
    uint32_t restarts ABSL_GUARDED_BY(mu) = 0;
    int64_t trained ABSL_GUARDED_BY(mu) = 0;  // data position, monotonic
    bool left ABSL_GUARDED_BY(mu) = false;
    bool fenced_logged ABSL_GUARDED_BY(mu) = false;
    // Written under mu, read without it (the slowest-clock computation and
    // lease checks).
    std::atomic<int64_t> clock{0};
    std::atomic<bool> live{false};
    std::atomic<int64_t> last_seen_ns{0};  // absl::ToUnixNanos
    std::atomic<int32_t> waiting{0};       // pulls waiting on the model
  };

 public:
  using Callback = std::function<void(absl::Status)>;
  using WaitId = uint64_t;

  // What a caller learns when it is admitted.
  struct Admission {
    int64_t clock = 0;           // the worker's clock after the call
    int64_t previous_clock = 0;  // its predecessor's (0 when none)
    // The worker id's data position after the call (the largest any of its
    // incarnations reported).
    int64_t trained = 0;
    bool new_incarnation = false;
  };

  // A push that BeginPush let through, to be finished with FinishPush.
  class PushClaim {
   public:
    // True when the push was applied before: acknowledge, apply nothing.
    bool duplicate() const { return duplicate_; }

   private:
    friend class WorkerRegistry;
    Worker* worker_ = nullptr;
    uint64_t incarnation_ = 0;
    uint64_t seq_ = 0;
    int64_t clock_ = 0;
    bool duplicate_ = false;
    bool finished_ = false;
  };

  static absl::StatusOr<std::unique_ptr<WorkerRegistry>> Create(
      RegistryOptions options);
  ~WorkerRegistry();  // Shutdown()

  // Identifies the caller of a heartbeat or pull: INVALID_ARGUMENT for a
  // malformed ref, FAILED_PRECONDITION for a replaced incarnation. Registers
  // a new worker id or incarnation, renews the lease, moves the clock
  // forward to ref.clock and the data position to ref.trained.
  absl::StatusOr<Admission> Admit(const WorkerRef& ref);

  // The worker is done: it stops counting for the slowest clock.
  absl::Status Leave(const WorkerRef& ref);

  // True when `ref` names the current incarnation of a known worker id:
  // its calls need no registration. A request from anyone else is validated
  // before the registry admits its caller, so that a refused request
  // registers nobody.
  bool IsCurrent(const WorkerRef& ref) const;

  // Admits the caller of a push (as Admit) and claims its sequence number:
  // a duplicate() claim for a push applied before; otherwise the caller
  // applies the push and then calls FinishPush. A retry that arrives while
  // its original is being applied waits for it and is then a duplicate.
  // INVALID_ARGUMENT for seq 0.
  //
  // A part re-routed from other shards (`moved_from`, PushRequest) is also a
  // duplicate when any origin applied it there: this shard's own window
  // answers for itself (waiting while it is being applied), the applied
  // seqs that moves brought answer for the others (a shard none came from
  // applied nothing of this incarnation's that moved here).
  absl::StatusOr<PushClaim> BeginPush(
      const WorkerRef& ref, uint64_t seq,
      absl::Span<const PushOriginRef> moved_from = {});

  // Records the outcome of a claimed push: applied (the seq is settled, the
  // push counted, the worker's clock moved to ref.clock + 1) or not (it
  // failed validation: a retry may try again). No-op for a duplicate claim.
  void FinishPush(PushClaim* claim, bool applied);

  // Runs done(OK) once a pull by `worker_id` for clock `for_clock` may be
  // answered under the consistency model: at once (on this thread, returning
  // 0) if it may be now; otherwise later, from the thread that made it
  // possible (or the executor), with OK, DEADLINE_EXCEEDED after the wait
  // timeout, CANCELLED after CancelWait, or UNAVAILABLE at Shutdown.
  // Returns the wait's id. REQUIRES: the worker was admitted.
  WaitId WhenReady(int32_t worker_id, int64_t for_clock, Callback done);

  // The caller of a waiting pull went away: the wait ends with CANCELLED and
  // no longer keeps its worker alive. No-op once the wait has ended.
  void CancelWait(WaitId id);

  // Evicts workers whose lease expired and ends timed-out waits; the
  // background thread calls this every few milliseconds.
  void Tick();

  // Fails every waiting pull with UNAVAILABLE and stops the background
  // thread. Idempotent.
  void Shutdown();

  std::vector<WorkerInfo> Workers() const;
  int64_t MinLiveClock() const;  // INT64_MAX when no worker is live
  RegistryCounters counters() const;
  int64_t waiting() const;
  const RegistryOptions& options() const { return options_; }

  // Every worker's record, for a checkpoint. A consistent cut with the
  // parameters only if no push is being applied meanwhile (the caller's
  // business).
  std::vector<CheckpointWorker> Export() const;
  // Loads a checkpoint's records; only before any call was admitted.
  absl::Status Import(const std::vector<CheckpointWorker>& records);

  // ---- Live slot moves (server/slot_mover.h; server/worker_moves.cc).
  // Every admitted worker's record, for the fenced round of a move out.
  std::vector<MovedWorkerRecord> ExportMoved() const;
  // INVALID_ARGUMENT naming the first malformed record (worker_id >= 0,
  // nonzero incarnations, its own not among the replaced, clock >= 0,
  // trained >= 0, applied seqs of shards below ShardMap::kMaxShards, at
  // most kMaxMovedSeqs seqs and shards in all needed).
  static absl::Status CheckMoved(absl::Span<const MovedWorkerRecord> records);
  static constexpr size_t kMaxMovedSeqs = size_t{1} << 20;
  // Takes in the records of the shard the slots came from, at the move's
  // commit, then releases the waits the clocks allow. Per record:
  //   unknown worker id: added with that incarnation, clock, data position
  //     and replaced incarnations; live (with a fresh lease) only if it was
  //     live there;
  //   the same incarnation: clock and data position the larger of both;
  //     live again (fresh lease) if it was live there and was not seen
  //     leaving here;
  //   another incarnation: see ImportMovedLocked. A record never fences
  //     an incarnation that may be the newer one.
  // All or nothing as to validation (CheckMoved first).
  absl::Status ImportWorkers(absl::Span<const MovedWorkerRecord> records);

 private:
  struct Waiter {
    Worker* worker;
    int64_t required;  // min live clock needed
    absl::Time deadline;
    Callback done;
  };
  using Ready = std::vector<std::pair<Callback, absl::Status>>;

  explicit WorkerRegistry(RegistryOptions options);
  // The worker record of an id, created on first use (nullptr for a
  // negative id).
  Worker* FindOrAdd(int32_t worker_id);
  std::vector<Worker*> AllWorkers() const;
  // Identity check and registration under the worker's lock.
  absl::StatusOr<Admission> AdmitLocked(Worker* w, const WorkerRef& ref)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu);
  // One record of ImportWorkers.
  void ImportMovedLocked(Worker* w, const MovedWorkerRecord& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu);
  // Merges a record's applied seqs of other shards into w's.
  void MergeMovedSeqs(Worker* w, const MovedWorkerRecord& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu);
  // Whether a re-routed part was applied at one of its origins: kApplied,
  // kInFlight (*busy: the seq to wait for) or kNew.
  DedupWindow::State OriginsState(Worker* w,
                                  absl::Span<const PushOriginRef> moved_from,
                                  uint64_t* busy) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu);
  // Appends `incarnations` (oldest first) to w's replaced ones, skipping
  // those it holds, keeping the newest retired_incarnations.
  void AddRetired(Worker* w, absl::Span<const uint64_t> incarnations)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu);
  // w's current incarnation is replaced (a restart, or a moved record of
  // the newer process): it is fenced from now on, its de-duplication window
  // starts over, and the restart is counted. The caller sets the new one.
  void RetireCurrent(Worker* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu);
  int64_t MinLiveClockExcept(const Worker* except) const;
  // "worker 3 at clock 5, worker 7 at clock 6" for the live workers below
  // `clock` (the first few), for a timed-out wait's message.
  std::string LiveWorkersBelow(int64_t clock) const;
  // Releases the waits that may go ahead or timed out (cheap when none
  // waits).
  void ReleaseWaiters();
  void CollectReadyLocked(Ready* ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(wait_mu_);
  void RunCallbacks(Ready ready, bool on_executor);
  void BackgroundLoop();

  const RegistryOptions options_;
  const int64_t slack_;  // -1 for ASP

  mutable absl::Mutex map_mu_;  // never held while taking a worker's lock
  absl::flat_hash_map<int32_t, std::unique_ptr<Worker>> workers_
      ABSL_GUARDED_BY(map_mu_);

  mutable absl::Mutex wait_mu_;
  absl::flat_hash_map<WaitId, Waiter> waiters_ ABSL_GUARDED_BY(wait_mu_);
  WaitId next_wait_id_ ABSL_GUARDED_BY(wait_mu_) = 1;
  bool shutdown_ ABSL_GUARDED_BY(wait_mu_) = false;
  // Waits registered or being registered; a clock change looks at waiters_
  // only when this is nonzero.
  std::atomic<int64_t> num_waiters_{0};

  std::atomic<uint64_t> evictions_{0}, fenced_{0}, restarts_{0}, cancelled_{0};

  // Timed on the monotonic clock: a step of the real-time clock back does
  // not hold evictions and wait deadlines up (common/steady_wait.h).
  SteadyNotification stop_thread_;
  std::thread background_;  // started in Create, joined in Shutdown
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_WORKER_REGISTRY_H_
