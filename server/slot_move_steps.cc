// SlotMover's state-changing steps, run directly or through the replica's
// log (ps_server --replicas; server/replication_log.h), and a backup's
// replay of its primary's steps.

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/map_change.h"
#include "common/shard_map_proto.h"
#include "server/push_gate.h"
#include "server/slot_mover.h"
#include "server/slot_state.h"

namespace asyncps {
namespace {

absl::StatusOr<ShardMap> NextMap(const MoveStep& step) {
  return ShardMapOr(step.next_map(), step.next_map().num_shards());
}

}  // namespace

MoveStep SlotMover::MoveStepTo(const ShardMap& next) {
  MoveStep step;
  ShardMapToProto(next, step.mutable_next_map());
  return step;
}

void SlotMover::WorkerToProto(const MovedWorkerRecord& r, MovedWorker* out) {
  out->set_worker_id(r.worker_id);
  out->set_incarnation(r.incarnation);
  for (uint64_t inc : r.retired) out->add_retired_incarnations(inc);
  out->set_clock(r.clock);
  out->set_trained(r.trained);
  out->set_live(r.live);
  out->set_left(r.left);
  for (const auto& [shard, seqs] : r.applied_seqs) {
    seqs.ToProto(shard, out->add_applied_seqs());
  }
}

MovedWorkerRecord SlotMover::WorkerFromProto(const MovedWorker& w) {
  MovedWorkerRecord r;
  r.worker_id = w.worker_id();
  r.incarnation = w.incarnation();
  r.retired.assign(w.retired_incarnations().begin(),
                   w.retired_incarnations().end());
  r.clock = w.clock();
  r.trained = w.trained();
  r.live = w.live();
  r.left = w.left();
  for (const AppliedSeqs& seqs : w.applied_seqs()) {
    r.applied_seqs[seqs.shard()].Merge(AppliedSeqSet::FromProto(seqs));
  }
  return r;
}

absl::Status SlotMover::CheckPrimary() const {
  if (c_->log == nullptr || c_->log->primary()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      "shard ", c_->shard_index,
      ": this replica is not its group's primary; slots move between "
      "primaries (the run's map in etcd names them)"));
}

absl::Status SlotMover::Step(
    MoveStep step, absl::FunctionRef<absl::Status(const MoveStep&)> body,
    bool acked) {
  if (c_->log == nullptr) return body(step);
  LogEntry entry;
  *entry.mutable_move() = std::move(step);
  absl::Status done;
  absl::StatusOr<uint64_t> index =
      c_->log->Run(std::move(entry), [&](LogEntry* e) {
        done = body(e->move());
        // The backups take what the primary did: nothing, when it failed.
        if (!done.ok()) e->mutable_move()->clear_step();
      });
  if (!index.ok()) return index.status();
  if (!done.ok() || !acked) return done;
  return WaitAcked(*index);
}

absl::Status SlotMover::WaitAcked(uint64_t index) {
  struct Wait {
    SteadyNotification done;  // its timeout on the monotonic clock
    absl::Status status;
  };
  auto wait = std::make_shared<Wait>();
  c_->log->WhenAcked(index, [wait](absl::Status s) {
    wait->status = std::move(s);
    wait->done.Notify();
  });
  // The log answers once the backups acknowledged, or once it is fenced;
  // a backup that stops acknowledging is dropped from the map meanwhile.
  if (!wait->done.WaitForNotificationWithTimeout(o_.round_timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "the backups did not acknowledge the move's entry ", index));
  }
  return wait->status;
}

absl::Status SlotMover::ApplyStep(const MoveStep& step) {
  switch (step.step_case()) {
    case MoveStep::kImported:
      return ImportBody(step, nullptr, nullptr);
    case MoveStep::kCommitted: {
      absl::Status s = CommitBody(step, nullptr);
      // Tensors and tables the move created here, as CreateTensor would.
      if (s.ok() && c_->specs != nullptr) s = c_->specs->Sync();
      return s;
    }
    case MoveStep::kDropped:
      return DropBody();
    case MoveStep::kFenced:
      return FenceBody(step);
    case MoveStep::kEnded:
      return EndBody(step);
    case MoveStep::kAdopted:
      return AdoptBody(step);
    case MoveStep::STEP_NOT_SET:
      return absl::OkStatus();  // a step its primary failed
  }
  return absl::InvalidArgumentError("a move step of an unknown kind");
}

absl::Status SlotMover::ImportBody(const MoveStep& step, SlotApplyStats* stats,
                                   std::string* last_spec) {
  absl::StatusOr<ShardMap> next = NextMap(step);
  if (!next.ok()) return next.status();
  absl::StatusOr<std::vector<uint32_t>> slots = SlotsMoving(
      c_->store->map(), *next, step.imported().source_index(), c_->shard_index);
  if (!slots.ok()) return slots.status();
  // Every slice and row must be of a moving slot.
  absl::StatusOr<SlotSet> set = SlotSet::Of(*next, *slots);
  if (!set.ok()) return set.status();
  SlotStateApplier applier(c_->store, &*set);
  absl::Status s;
  for (const std::string& r : step.imported().records()) {
    s = applier.Apply(r);
    if (!s.ok()) break;
  }
  if (stats != nullptr) {
    stats->slices += applier.stats().slices;
    stats->rows += applier.stats().rows;
    stats->tensor_names.insert(stats->tensor_names.end(),
                               applier.stats().tensor_names.begin(),
                               applier.stats().tensor_names.end());
  }
  if (last_spec != nullptr && !applier.last_spec().empty()) {
    *last_spec = applier.last_spec();
  }
  return s;
}

absl::Status SlotMover::CommitBody(const MoveStep& step,
                                   const std::function<absl::Status()>& check) {
  absl::StatusOr<ShardMap> next = NextMap(step);
  if (!next.ok()) return next.status();
  std::vector<MovedWorkerRecord> workers;
  for (const MovedWorker& w : step.committed().workers()) {
    workers.push_back(WorkerFromProto(w));
  }
  // Refused before anything changes (on a replicated primary no tensor is
  // created meanwhile: creations run through the log too).
  if (check) {
    absl::Status s = check();
    if (!s.ok()) return s;
  }
  PushGate::Closed closed(c_->gate);
  // The clocks first, so that no pull of the slots is answered here by
  // the new map before the slow workers' clocks are known.
  absl::Status s = c_->workers->ImportWorkers(workers);
  if (!s.ok()) return s;
  // Checked again under the store's map lock, which creations take.
  s = check ? c_->store->AdoptMap(*next, check) : c_->store->AdoptMap(*next);
  if (s.ok()) drained_ = false;
  return s;
}

absl::Status SlotMover::DropBody() {
  PushGate::Closed closed(c_->gate);
  const auto [slices, rows] = c_->store->DropImports();
  if (slices > 0 || rows > 0) {
    c_->logger->info(
        "dropped what an unfinished move imported: {} slices, {} "
        "rows",
        slices, rows);
  }
  return absl::OkStatus();
}

absl::Status SlotMover::FenceBody(const MoveStep& step) {
  absl::StatusOr<ShardMap> next = NextMap(step);
  if (!next.ok()) return next.status();
  // Pushes in flight end before the fence goes up; those after it are
  // refused for these slots.
  PushGate::Closed closed(c_->gate);
  fence_->Raise(absl::StrCat("slots of this shard are moving to shard ",
                             step.fenced().destination_index(), " (map epoch ",
                             next->epoch(), "); retry"));
  absl::MutexLock l(&mu_);
  if (!leaving_.has_value()) {  // a backup's (the primary set its own)
    leaving_ = Leaving{*next, step.fenced().destination(),
                       step.fenced().destination_index(), Now()};
  }
  return absl::OkStatus();
}

absl::Status SlotMover::EndBody(const MoveStep& step) {
  absl::StatusOr<ShardMap> next = NextMap(step);
  if (!next.ok()) return next.status();
  const bool committed = step.ended().committed();
  PushGate::Closed closed(c_->gate);
  if (committed) {
    absl::Status s = c_->store->AdoptMap(*next);
    // Cannot happen for a map that SlotsMoving accepted; stay fenced
    // rather than serve slots that moved.
    if (!s.ok()) return s;
    if (c_->checkpointer != nullptr) {
      // The slices given away are in no delta: the next checkpoint is full.
      c_->checkpointer->RequestFull(
          [](const absl::StatusOr<CheckpointInfo>&) {});
    }
    const std::vector<int> serving = next->serving_shards();
    drained_ = std::find(serving.begin(), serving.end(), c_->shard_index) ==
               serving.end();
  }
  absl::MutexLock l(&mu_);
  if (leaving_.has_value() && leaving_->next.epoch() == next->epoch()) {
    leaving_.reset();
  }
  fence_->Lower();
  return absl::OkStatus();
}

absl::Status SlotMover::AdoptBody(const MoveStep& step) {
  absl::StatusOr<ShardMap> map = NextMap(step);
  if (!map.ok()) return map.status();
  // No push between its map check and its last slice.
  PushGate::Closed closed(c_->gate);
  if (!step.adopted().remake_lost()) return c_->store->AdoptMap(*map);
  absl::StatusOr<uint64_t> made = c_->store->AdoptMapRemakingLost(*map);
  if (!made.ok()) return made.status();
  c_->logger->warn(
      "made {} slices anew for the slots the map of epoch {} "
      "gave this shard",
      *made, map->epoch());
  return absl::OkStatus();
}

}  // namespace asyncps
