#ifndef ASYNCPS_SERVER_SLOT_MOVER_H_
#define ASYNCPS_SERVER_SLOT_MOVER_H_

// Live slot moves between two shards of a slotted run, both sides
// (the protocol: proto/slot_moves.proto).
//
// Destination (MoveIn, asked by psctl): copies the moving slots' state from
// the source in rounds while the source keeps serving them (ExportSlots
// since the previous round's change epoch), until a round is small; then a
// fenced round: the source stops serving (server/slot_fence.h) and hands
// over what changed since. The destination installs it and, with its push
// gate closed, adopts the next map: the move is committed. It then tells
// the source (FinishMove), which adopts the next map too (dropping the
// slots) and serves again. If anything fails before the commit, the
// destination drops what it imported and the move is aborted: both shards
// serve the old map, nothing moved.
//
// The destination decides how a move ended, once: a source fenced for
// longer than fence_timeout without FinishMove asks it (MoveState), and a
// move not committed yet is aborted by that question. A destination that
// restarted answers from the map its files restored (committed when its
// epoch reached the move's). So a killed source or destination, or a lost
// FinishMove, ends a move committed on both or aborted on both.
//
// With checkpoints on, the destination writes a full checkpoint after the
// commit and before it tells the source (the source stays fenced that much
// longer): a destination restarted after the source dropped the slots
// restores them and the map that gives it them. The source's next
// checkpoint is a full one too (a delta cannot record slices given away).
//
// Pushes already applied by the source are not copied twice and never
// re-applied: the source refuses a request routed with the old map after
// the move (the client routes it again by the new map, with a new
// sequence number), and answers a retry of one it applied before as a
// duplicate. The fenced round carries the source's worker records (ids,
// incarnations, clocks, and the seqs it had applied, with those earlier
// moves brought it), which the destination imports at the commit
// (WorkerRegistry::ImportWorkers): a shard that owned no slot may never
// have heard from a slow worker, and SSP/BSP must not let a fast one run
// ahead there; and a push part whose answer was lost at the source, which
// a client re-routes naming it (PushRequest.moved_from), is applied here
// only if the source had not.
//
// Replicated shards (ps_server --replicas): the primaries of the two
// groups move the slots, and every step that changes a replica's state
// runs through its group's log (server/slot_move_steps.cc), so that each
// backup takes it too: the destination's imports (a round in pieces), its
// commit (acknowledged by every counted backup before the move counts as
// committed: a backup promoted after that holds the slots), a drop of
// imports, the source's fence (acknowledged before the fenced round goes
// out: a backup promoted after that stays fenced and asks how the move
// ended) and its end. Only a primary moves, answers MoveState or exports;
// a fenced source asks the destination group's primary of the moment
// (SlotMoverOptions::primary_of).
//
// Thread-safe. One move in or out at a time per shard.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/security.h"
#include "common/shard_map.h"
#include "common/steady_wait.h"
#include "proto/replication.pb.h"
#include "proto/slot_moves.grpc.pb.h"
#include "server/map_record_store.h"
#include "server/service_context.h"
#include "server/slot_fence.h"
#include "server/slot_state.h"
#include "server/worker_registry.h"

namespace asyncps {

struct SlotMoverOptions {
  // TLS and cluster token for the calls to the other shard.
  SecurityOptions security;
  // A fenced source asks the destination how the move ended after this
  // long without FinishMove, and again every fence_timeout until it knows.
  absl::Duration fence_timeout = absl::Seconds(2);
  // Deadline of one copy round.
  absl::Duration round_timeout = absl::Minutes(5);
  // In a replicated run: the address of shard `shard`'s primary now (a
  // fenced source asks it how the move ended; the move named the primary
  // of its start). Null: the address the move named.
  std::function<absl::StatusOr<std::string>(int shard)> primary_of;
  // The copy rounds before the fence (source side) send at most this many
  // MB/s (1e6 bytes), so that a big move leaves the cores to training; the
  // fenced round is never held back. 0 = as fast as it goes.
  double copy_mb_s = 0;
  // Where the run's map record lives (server/map_keeper.h) in a run with
  // etcd; null: at the keeper a move names (MoveSlotsRequest.keeper), or,
  // when it names none, this shard's own.
  std::shared_ptr<MapRecordStore> run_map_record;
  // Where this shard keeps its own map record when it is the run's keeper
  // (LocalMapRecord: its checkpoint directory); "" = in memory only.
  std::string map_record_path;
  FileSystem* fs = nullptr;  // for map_record_path; null = the default
};

class SlotMover {
 public:
  // `context` and `fence` must outlive the mover; the service checks
  // `fence` on its data path.
  SlotMover(const ServiceContext* context, SlotFence* fence,
            SlotMoverOptions options);
  ~SlotMover();
  SlotMover(const SlotMover&) = delete;
  SlotMover& operator=(const SlotMover&) = delete;

  // ---- Destination side.
  // Runs a whole move (see above); FAILED_PRECONDITION for a move that is
  // not one step of this shard's map, another move in progress, or a
  // replicated shard; the copy's error otherwise (the move aborted).
  absl::StatusOr<MoveSlotsResponse> MoveIn(const MoveSlotsRequest& request);
  // Whether the move to epoch `move_epoch` committed; one in progress is
  // aborted by the question. With `confirm`: whether it is being copied
  // now (deciding nothing). UNAVAILABLE on a backup, and while the commit
  // waits for the backups (ask again).
  absl::StatusOr<MoveStateResponse> State(const MoveStateRequest& request);

  // ---- Source side.
  // One copy round: calls `write` with each chunk (false = the caller
  // went away: stop). With `fence`, raises the fence first, once the
  // destination confirmed it copies this move (FAILED_PRECONDITION, no
  // fence, when it does not).
  absl::Status Export(
      const ExportSlotsRequest& request,
      const std::function<bool(const ExportSlotsChunk&)>& write);
  // The destination's word that a move ended. Taken as a hint only: the
  // destination is asked (MoveState) and the fence ends as it answers
  // (adopt the next map, or serve the old one again), so that a FinishMove
  // from anyone else cannot drop slots or end a fence early.
  absl::Status Finish(const FinishMoveRequest& request);

  // Whether moves out gave away every slot this process owned (and none
  // came in since).
  bool drained() const { return drained_.load(); }
  // Whether a move in or out of this shard is in progress.
  bool Moving() const ABSL_LOCKS_EXCLUDED(mu_);
  // The move this shard takes part in now, for Status ("" for none).
  std::string Describe() const ABSL_LOCKS_EXCLUDED(mu_);

  // ---- Any shard.
  // Adopts a newer map that gives this shard no slot (it may take some:
  // those a move committed while this shard ran on older files). With
  // `remake_lost` it may give slots too, whose slices are then made anew
  // (ShardStore::AdoptMapRemakingLost): for the run's own map only.
  absl::StatusOr<ShardMap> Adopt(const ShardMap& map, bool remake_lost = false);

  // A request was routed with a newer map than this shard serves. In a
  // run whose map record is in etcd (run_map_record), the watcher thread
  // then reads the record (at most every 500 ms) and, when its committed
  // map is newer than the one served, adopts it (Adopt with remake_lost):
  // a shard restarted on files older than the run's map (a move among
  // other shards it missed the hand-out of, a move out of it, or, when
  // every replica of a group was lost, a move into it) catches up by
  // itself instead of refusing every request until psctl adopt. While
  // the record stays ahead (this replica is no primary yet, or a move of
  // its slots is under way) it is read again every 500 ms, and it is read
  // every 5 s anyway (a shard that no request reaches, such as one that
  // owns no slot, may have missed a map too). Cheap: the first call wakes
  // the watcher, the others return at once.
  void NewerMapRouted();

  // ---- The run's map keeper (the shard psctl names): this shard's own
  // map record, for the SlotMoves service to serve; FAILED_PRECONDITION
  // for another run's id.
  absl::StatusOr<MapRecordStore*> KeeperRecord(const std::string& run_id);

  // ---- A backup of a replicated shard: takes its primary's step.
  absl::Status ApplyStep(const MoveStep& step) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The mover's time: monotonic, so that a step of the real-time clock
  // neither ends a fence's wait for its destination's word early nor
  // allows an aborted epoch's retry at once (gRPC deadlines stay on the
  // real-time clock, which gRPC expects).
  static absl::Time Now() { return Clock::Monotonic()->Now(); }
  enum class Outcome { kCopying, kCommitting, kCommitted, kAborted };
  // A move out of this shard that raised the fence.
  struct Leaving {
    ShardMap next;
    std::string destination;
    int destination_index = 0;
    absl::Time fenced_at;
  };
  struct Round {
    uint64_t bytes = 0;
    uint64_t slices = 0;
    uint64_t rows = 0;
    uint32_t next_since = 0;
    // The source's workers (the fenced round only), checked.
    std::vector<MovedWorkerRecord> workers;
    std::vector<std::string> tensors;  // named by the round's records
  };

  // After the first copy round and at the commit: FAILED_PRECONDITION if
  // this shard has a
  // tensor with slices in `slots` that the source did not send (its
  // creation has not reached the source yet): moved on, those slices would
  // exist on no shard, and the creation, when it reaches the source, would
  // not make them here.
  absl::Status CheckSourceTensors(const std::vector<std::string>& sent,
                                  const SlotSet& slots) const;

  // UNAVAILABLE on a backup of a replicated shard.
  absl::Status CheckPrimary() const;
  // Marks the move to `epoch` in progress here (`what` for Status);
  // FAILED_PRECONDITION while another move of this shard goes on, or this
  // one was tried too recently (MayRetry).
  absl::Status BeginMoveIn(uint64_t epoch, std::string what)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The records of `slots` changed since request.since, captured in a few
  // groups, each sent before the next is read; paced before the fence.
  absl::Status SendRound(
      const ExportSlotsRequest& request, const ShardMap& current,
      const std::vector<uint32_t>& slots,
      const std::function<bool(const ExportSlotsChunk&)>& write);
  absl::Status CheckLeaving(const ExportSlotsRequest& request,
                            const ShardMap& next) ABSL_LOCKS_EXCLUDED(mu_);
  // The rounds before the fence (as MoveSlotsRequest says when to stop),
  // counted in *out; *round's `since` is left for the fenced round.
  // The copy rounds before the fence; the tensors their records named go
  // to *sent.
  absl::Status CopyUnfenced(SlotMoves::Stub* source,
                            const MoveSlotsRequest& request,
                            const ShardMap& next, const SlotSet& slots,
                            ExportSlotsRequest* round, MoveSlotsResponse* out,
                            std::vector<std::string>* sent);
  // One copy round of the move to `next` from shard `source_index`; each
  // chunk is imported as one step.
  absl::StatusOr<Round> CopyRound(SlotMoves::Stub* source,
                                  const ExportSlotsRequest& request,
                                  const ShardMap& next, int source_index);
  // Imports `workers` and adopts `next` with pushes held back.
  // ... after CheckSourceTensors(sent, slots) under the store's map lock,
  // so that no tensor created here meanwhile is missed.
  absl::Status Commit(uint64_t epoch, const ShardMap& next,
                      const std::vector<MovedWorkerRecord>& workers,
                      const std::vector<std::string>& sent,
                      const SlotSet& slots) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops what the move imported. The move to `next` is remembered as
  // aborted (a fenced source asking gets that answer), or with `forget` (no
  // source was fenced for it) forgotten.
  void Abort(const ShardMap& next, bool forget) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether a move to `epoch`, aborted, may be tried again now: a source
  // learns how a move ended only by asking (MoveState, whose answer is
  // dropped after fence_timeout), so once two fence_timeouts passed since
  // the abort and since the last answer about it, no answer about the old
  // try can reach a source fenced for a new one.
  bool MayRetry(uint64_t epoch) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With checkpoints on, makes the specs of tensors and tables the move
  // created (and schedules it adopted) durable in the spec file, and writes
  // a full checkpoint of the committed move and waits for it: a restart
  // then restores the map the source is told of.
  void SaveCommit(uint64_t epoch);
  void TellSource(SlotMoves::Stub* source, uint64_t epoch, bool committed);
  // MoveState at `destination` (within fence_timeout).
  absl::StatusOr<MoveStateResponse> CallMoveState(
      const std::string& destination, uint64_t epoch, bool confirm) const;
  // OK when the destination says it is copying the move to `epoch`
  // (MoveState with confirm); FAILED_PRECONDITION otherwise.
  // ---- The run's map record (server/slot_mover_keeper.cc).
  // The record a move takes its epoch in (*remote holds a keeper's client).
  MapRecordStore* MapRecordFor(const MoveSlotsRequest& request,
                               std::unique_ptr<MapRecordStore>* remote);
  MapReservation ReservationOf(const MoveSlotsRequest& request,
                               size_t slots) const;
  // ReserveMapEpoch; refused, the move is forgotten (nothing was copied).
  absl::Status TakeEpoch(MapRecordStore* record, const MapReservation& r)
      ABSL_LOCKS_EXCLUDED(mu_);
  // MoveState asked of the move that holds the record's next epoch.
  absl::StatusOr<MoveStateResponse> AskHolder(const MapReservation& held,
                                              bool confirm) const;
  // SettleMapEpoch, its failure logged.
  void Settle(MapRecordStore* record, const MapReservation& r, bool committed);
  absl::Status ConfirmDestination(uint64_t epoch,
                                  const std::string& destination);
  // Asks the destination (its group's primary now, with primary_of) how
  // the move to `epoch` ended and ends the fence so (UNAVAILABLE, the
  // fence kept, when it does not answer).
  absl::Status AskDestination(uint64_t epoch, std::string destination,
                              int destination_index) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the fence as the destination said, under the push gate.
  absl::Status EndLeaving(uint64_t epoch, bool committed)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Watch() ABSL_LOCKS_EXCLUDED(mu_);

  // ---- Catching up with the run's map record
  // (server/slot_mover_adopt.cc).
  void CatchUpWithRun() ABSL_LOCKS_EXCLUDED(mu_);
  // Logs why a catch-up failed, a warning at most every 10 s.
  void CatchUpFailed(const std::string& why);

  // ---- The steps (server/slot_move_steps.cc).
  static MoveStep MoveStepTo(const ShardMap& next);
  static void WorkerToProto(const MovedWorkerRecord& r, MovedWorker* out);
  static MovedWorkerRecord WorkerFromProto(const MovedWorker& w);
  // Runs `body` on this replica: directly, or on a replicated shard as the
  // primary's next log entry (UNAVAILABLE, nothing run, on a backup); a
  // step whose body failed is logged empty (the backups do nothing). With
  // `acked`, OK only once every counted backup holds the step.
  absl::Status Step(MoveStep step,
                    absl::FunctionRef<absl::Status(const MoveStep&)> body,
                    bool acked) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status WaitAcked(uint64_t index);
  // The bodies, the same on the primary and on a backup. ImportBody adds
  // what it applied to *stats and the record the next piece starts with
  // to *last_spec (each may be null).
  absl::Status ImportBody(const MoveStep& step, SlotApplyStats* stats,
                          std::string* last_spec);
  // With `check` (the primary): refuses before anything changes, and
  // again under the store's map lock.
  absl::Status CommitBody(const MoveStep& step,
                          const std::function<absl::Status()>& check);
  absl::Status DropBody();
  absl::Status FenceBody(const MoveStep& step) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status EndBody(const MoveStep& step) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status AdoptBody(const MoveStep& step);

  const ServiceContext* const c_;
  SlotFence* const fence_;
  const SlotMoverOptions o_;

  // Serializes the ends of a fence (the watcher and FinishMove may both
  // learn it); taken before the log's lock, which is taken before mu_.
  absl::Mutex end_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  // Moves into this shard by the epoch they make, and when each was last
  // aborted or answered about (MoveState).
  absl::flat_hash_map<uint64_t, Outcome> incoming_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, absl::Time> last_word_ ABSL_GUARDED_BY(mu_);
  bool moving_in_ ABSL_GUARDED_BY(mu_) = false;
  std::string moving_in_what_ ABSL_GUARDED_BY(mu_);  // while moving_in_
  std::optional<Leaving> leaving_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> drained_{false};
  // NewerMapRouted asked for a catch-up the watcher has not begun.
  std::atomic<bool> catch_up_wanted_{false};
  absl::Time next_catch_up_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // The watcher's wait, on the monotonic clock (common/steady_wait.h):
  // notified (under mu_) at stop_ and at every NewerMapRouted, which
  // counts in wakes_.
  std::condition_variable_any watcher_cv_;
  uint64_t wakes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_catch_up_warning_ = absl::InfinitePast();  // watcher's
  LocalMapRecord own_record_;
  std::thread watcher_;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_SLOT_MOVER_H_
