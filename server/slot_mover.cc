#include "server/slot_mover.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "common/grpc_status.h"
#include "common/map_change.h"
#include "common/names.h"
#include "common/net.h"
#include "common/shard_map_proto.h"
#include "common/tensor_layout.h"
#include "server/push_gate.h"
#include "server/slot_state.h"

namespace asyncps {
namespace {

constexpr uint32_t kDefaultRounds = 4;
constexpr uint64_t kDefaultFenceBytes = uint64_t{1} << 20;
// Records per ExportSlotsChunk, at most this many bytes (one may exceed it).
constexpr size_t kChunkBytes = size_t{4} << 20;
// Groups of slots a copy round captures one after the other.
constexpr size_t kCaptureGroups = 8;
constexpr int kFinishTries = 3;

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

}  // namespace

SlotMover::SlotMover(const ServiceContext* context, SlotFence* fence,
                     SlotMoverOptions options)
    : c_(context),
      fence_(fence),
      o_(std::move(options)),
      own_record_(absl::StrCat("the run's map keeper (shard ",
                               context->shard_index, ")"),
                  o_.map_record_path, o_.fs) {
  watcher_ = std::thread([this] { Watch(); });
}

SlotMover::~SlotMover() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
    watcher_cv_.notify_all();
  }
  watcher_.join();
}

// ---------------------------------------------------------------- destination

absl::StatusOr<MoveSlotsResponse> SlotMover::MoveIn(
    const MoveSlotsRequest& request) {
  if (absl::Status s = CheckPrimary(); !s.ok()) return s;
  absl::StatusOr<ShardMap> next =
      ShardMapOr(request.next_map(), request.next_map().num_shards());
  if (!next.ok()) return next.status();
  const ShardMap current = c_->store->map();
  absl::StatusOr<std::vector<uint32_t>> slots =
      SlotsMoving(current, *next, request.source_index(), c_->shard_index);
  if (!slots.ok()) return slots.status();
  absl::StatusOr<SlotSet> set = SlotSet::Of(*next, *slots);
  if (!set.ok()) return set.status();
  if (request.source().empty() || request.destination().empty()) {
    return absl::InvalidArgumentError(
        "a move names the source's and this shard's addresses");
  }
  const uint64_t epoch = next->epoch();
  if (absl::Status s = BeginMoveIn(
          epoch,
          absl::StrCat("copying ", slots->size(), " slots in from shard ",
                       request.source_index(), " (map epoch ", epoch, ")"));
      !s.ok()) {
    return s;
  }
  // The run's next epoch is this move's, or the move is refused before
  // anything is copied (server/map_keeper.h).
  std::unique_ptr<MapRecordStore> keeper;
  MapRecordStore* const record = MapRecordFor(request, &keeper);
  const MapReservation reservation = ReservationOf(request, slots->size());
  if (absl::Status reserved = TakeEpoch(record, reservation); !reserved.ok()) {
    return reserved;
  }
  c_->logger->info("moving {} slots in from shard {} ({}), map epoch {}",
                   slots->size(), request.source_index(), request.source(),
                   epoch);
  auto stub = SlotMoves::NewStub(MakeChannel(request.source(), 0, o_.security));
  absl::Status s;
  if (c_->log != nullptr) {
    // What a move this group's earlier primary did not finish imported.
    MoveStep drop = MoveStepTo(*next);
    drop.mutable_dropped();
    s = Step(
        std::move(drop), [&](const MoveStep&) { return DropBody(); },
        /*acked=*/false);
  }
  ExportSlotsRequest round;
  *round.mutable_next_map() = request.next_map();
  round.set_destination_index(c_->shard_index);
  round.set_destination(request.destination());
  round.set_run_id(c_->run_id);
  MoveSlotsResponse out;
  out.set_slots(static_cast<uint32_t>(slots->size()));
  const absl::Time start = Now();
  std::vector<std::string> sent;  // the tensors the source named
  if (s.ok()) {
    s = CopyUnfenced(stub.get(), request, *next, *set, &round, &out, &sent);
  }
  const absl::Time fenced = Now();
  out.set_copy_ms(Ms(fenced - start));
  absl::StatusOr<Round> last = absl::UnknownError("not run");
  if (s.ok()) {
    round.set_fence(true);
    last = CopyRound(stub.get(), round, *next, request.source_index());
    s = last.status();
  }
  if (s.ok()) {
    sent.insert(sent.end(), last->tensors.begin(), last->tensors.end());
    s = Commit(epoch, *next, last->workers, sent, *set);
  }
  if (!s.ok()) {
    c_->logger->warn("moving slots in from shard {} failed: {}",
                     request.source_index(), s.ToString());
    // Before the fenced round no source waits to ask how the move ended:
    // psctl may plan the same map epoch again at once (the map stays one
    // epoch on); after it, once no answer about this try can be in flight
    // (MayRetry).
    Abort(*next, /*forget=*/!round.fence());
    if (round.fence()) TellSource(stub.get(), epoch, /*committed=*/false);
    Settle(record, reservation, /*committed=*/false);
    return s;
  }
  SaveCommit(epoch);
  TellSource(stub.get(), epoch, /*committed=*/true);
  Settle(record, reservation, /*committed=*/true);
  out.set_bytes(out.bytes() + last->bytes);
  out.set_rounds(out.rounds() + 1);
  out.set_fence_ms(Ms(Now() - fenced));
  ShardMapToProto(*next, out.mutable_map());
  c_->logger->info(
      "moved {} slots in from shard {}: {} bytes in {} rounds, copy {:.1f} "
      "ms, fenced {:.1f} ms; serving map epoch {}",
      out.slots(), request.source_index(), out.bytes(), out.rounds(),
      out.copy_ms(), out.fence_ms(), epoch);
  return out;
}

absl::Status SlotMover::CopyUnfenced(SlotMoves::Stub* source,
                                     const MoveSlotsRequest& request,
                                     const ShardMap& next, const SlotSet& slots,
                                     ExportSlotsRequest* round,
                                     MoveSlotsResponse* out,
                                     std::vector<std::string>* sent) {
  const uint32_t max_rounds =
      request.max_rounds() > 0 ? request.max_rounds() : kDefaultRounds;
  const uint64_t fence_bytes =
      request.fence_bytes() > 0 ? request.fence_bytes() : kDefaultFenceBytes;
  uint64_t previous = 0;
  for (uint32_t r = 0; r < max_rounds; ++r) {
    const absl::Time round_start = Now();
    absl::StatusOr<Round> done =
        CopyRound(source, *round, next, request.source_index());
    if (!done.ok()) return done.status();
    sent->insert(sent->end(), done->tensors.begin(), done->tensors.end());
    if (r == 0) {
      // Early, while no source is fenced: the next try can go at once.
      absl::Status s = CheckSourceTensors(*sent, slots);
      if (!s.ok()) return s;
    }
    c_->logger->debug("copy round {}: {} bytes in {:.1f} ms", r + 1,
                      done->bytes, Ms(Now() - round_start));
    if (out->rounds() == 0) {  // everything of the slots
      out->set_slices(done->slices);
      out->set_rows(done->rows);
      out->set_state_bytes(done->bytes);
      out->set_first_round_ms(Ms(Now() - round_start));
    }
    out->set_bytes(out->bytes() + done->bytes);
    out->set_rounds(out->rounds() + 1);
    round->set_since(done->next_since);
    // Small enough to copy fenced, or not shrinking (the slots change as
    // fast as they are copied: another round would copy them again).
    if (done->bytes < fence_bytes || (r > 0 && 2 * done->bytes > previous)) {
      break;
    }
    previous = done->bytes;
  }
  return absl::OkStatus();
}

absl::Status SlotMover::CheckSourceTensors(const std::vector<std::string>& sent,
                                           const SlotSet& slots) const {
  for (const TensorSpec& spec : c_->store->ListTensors()) {
    if (std::find(sent.begin(), sent.end(), spec.name()) != sent.end()) {
      continue;
    }
    absl::StatusOr<TensorLayout> layout = TensorLayout::FromSpec(spec);
    if (!layout.ok()) return layout.status();
    for (uint32_t i = 0; i < layout->num_slices(); ++i) {
      if (!slots.HasSlice(spec.name(), i)) continue;
      return absl::FailedPreconditionError(absl::StrCat(
          "tensor ", QuoteName(spec.name()),
          " exists here but not on the source, which its creation has not "
          "reached yet; plan the move again once it has"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SlotMover::Round> SlotMover::CopyRound(
    SlotMoves::Stub* source, const ExportSlotsRequest& request,
    const ShardMap& next, int source_index) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + o_.round_timeout));
  std::unique_ptr<grpc::ClientReader<ExportSlotsChunk>> reader =
      source->ExportSlots(&ctx, request);
  Round round;
  ExportSlotsChunk chunk;
  bool last = false;
  // Each chunk is one step (a log entry on a replicated shard), starting
  // with the tensor or table record the chunk before left off in.
  SlotApplyStats stats;
  std::string context;
  absl::Status applied;
  while (applied.ok() && reader->Read(&chunk)) {
    MoveStep step = MoveStepTo(next);
    ImportedSlots* imported = step.mutable_imported();
    imported->set_source_index(source_index);
    if (!context.empty()) imported->add_records(context);
    for (std::string& r : *chunk.mutable_records()) {
      round.bytes += r.size();
      imported->add_records(std::move(r));
    }
    applied = Step(
        std::move(step),
        [&](const MoveStep& s) { return ImportBody(s, &stats, &context); },
        /*acked=*/false);
    if (chunk.last()) {
      last = true;
      round.next_since = chunk.next_since();
      for (const MovedWorker& w : chunk.workers()) {
        round.workers.push_back(WorkerFromProto(w));
      }
    }
  }
  round.slices = stats.slices;
  round.rows = stats.rows;
  round.tensors = stats.tensor_names;
  if (!applied.ok()) {
    ctx.TryCancel();
    reader->Finish();
    return applied;
  }
  absl::Status s = FromGrpcStatus(reader->Finish());
  if (!s.ok()) return s;
  if (!last) {
    return absl::UnavailableError(
        "the source ended a copy round without its last chunk");
  }
  s = WorkerRegistry::CheckMoved(round.workers);
  if (!s.ok()) return s;
  return round;
}

absl::Status SlotMover::BeginMoveIn(uint64_t epoch, std::string what) {
  absl::MutexLock l(&mu_);
  if (moving_in_ || leaving_.has_value()) {
    return absl::FailedPreconditionError(
        "another move of this shard's slots is in progress");
  }
  if (incoming_.contains(epoch) && !MayRetry(epoch)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the move to map epoch ", epoch,
                     " was tried already; plan again in a few seconds"));
  }
  incoming_[epoch] = Outcome::kCopying;
  moving_in_ = true;
  moving_in_what_ = std::move(what);
  return absl::OkStatus();
}

absl::Status SlotMover::Commit(uint64_t epoch, const ShardMap& next,
                               const std::vector<MovedWorkerRecord>& workers,
                               const std::vector<std::string>& sent,
                               const SlotSet& slots) {
  {
    absl::MutexLock l(&mu_);
    if (incoming_[epoch] == Outcome::kAborted) {
      moving_in_ = false;
      return absl::AbortedError(absl::StrCat(
          "the source asked how the move to map epoch ", epoch,
          " ended before it was committed (it waited too long): aborted"));
    }
    // A source asking from now on is told to ask again, until the commit
    // is certain (on a replicated shard: every counted backup holds it).
    incoming_[epoch] = Outcome::kCommitting;
  }
  MoveStep step = MoveStepTo(next);
  for (const MovedWorkerRecord& w : workers) {
    WorkerToProto(w, step.mutable_committed()->add_workers());
  }
  // A tensor created here since the first round, which the source has not
  // heard of either, would lose the moving slots' slices too.
  // A replicated destination serves the new map only once its backups hold
  // the commit: until then its calls are refused UNAVAILABLE (retried), so
  // no client learns a map that a takeover by a backup without the commit
  // would undo. If they never acknowledge it (this replica lost its role)
  // the refusal stays: the process starts over.
  bool held = false;
  const ShardMap before = c_->store->map();
  const absl::Status s = Step(
      std::move(step),
      [&](const MoveStep& st) {
        absl::Status done =
            CommitBody(st, [&] { return CheckSourceTensors(sent, slots); });
        if (done.ok() && c_->log != nullptr) {
          fence_->RaiseCommitting(absl::StrCat("the move to map epoch ", epoch,
                                               " is being committed; retry"),
                                  before);
          held = true;
          absl::MutexLock l(&mu_);
          moving_in_what_ = absl::StrCat(
              "committing the move to map epoch ", epoch,
              ": waiting for the backups to hold it (calls refused, the map "
              "shown is epoch ",
              before.epoch(), ")");
        }
        return done;
      },
      /*acked=*/true);
  if (held && s.ok()) fence_->Lower();
  absl::MutexLock l(&mu_);
  moving_in_ = false;
  // Failed: the caller aborts (on a replica that lost its primary role the
  // abort changes nothing either: its log refuses, and it answers no
  // source).
  if (s.ok()) incoming_[epoch] = Outcome::kCommitted;
  return s;
}

bool SlotMover::MayRetry(uint64_t epoch) const {
  auto it = incoming_.find(epoch);
  if (it == incoming_.end()) return true;
  if (it->second != Outcome::kAborted) return false;
  auto word = last_word_.find(epoch);
  return word == last_word_.end() ||
         Now() >= word->second + 2 * o_.fence_timeout;
}

void SlotMover::Abort(const ShardMap& next, bool forget) {
  const uint64_t epoch = next.epoch();
  {
    absl::MutexLock l(&mu_);
    moving_in_ = false;
    if (forget) {
      incoming_.erase(epoch);
      last_word_.erase(epoch);
    } else {
      incoming_[epoch] = Outcome::kAborted;
      last_word_[epoch] = Now();
    }
  }
  // What was imported of slots this shard does not own goes.
  MoveStep step = MoveStepTo(next);
  step.mutable_dropped();
  const absl::Status s = Step(
      std::move(step), [&](const MoveStep&) { return DropBody(); },
      /*acked=*/false);
  if (!s.ok()) {
    c_->logger->warn("dropping what the aborted move imported: {}",
                     s.ToString());
  }
}

void SlotMover::SaveCommit(uint64_t epoch) {
  if (c_->specs != nullptr) {
    // Tensors and tables the move created here, as CreateTensor would.
    absl::Status synced = c_->specs->Sync();
    if (!synced.ok()) {
      c_->logger->error("the spec file after the move to map epoch {}: {}",
                        epoch, synced.ToString());
    }
  }
  if (c_->checkpointer == nullptr) return;
  absl::Notification written;
  absl::Status result;
  c_->checkpointer->RequestFull(
      [&](const absl::StatusOr<CheckpointInfo>& info) {
        result = info.status();
        written.Notify();
      });
  written.WaitForNotification();  // the checkpoint thread answers every one
  if (!result.ok()) {
    c_->logger->error(
        "the checkpoint of the move to map epoch {} failed ({}): a restart "
        "before the next one restores the map before the move",
        epoch, result.ToString());
  }
}

void SlotMover::TellSource(SlotMoves::Stub* source, uint64_t epoch,
                           bool committed) {
  FinishMoveRequest request;
  request.set_move_epoch(epoch);
  request.set_committed(committed);
  for (int i = 0; i < kFinishTries; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    FinishMoveResponse response;
    const grpc::Status s = source->FinishMove(&ctx, request, &response);
    if (s.ok()) return;
    c_->logger->warn("telling the source that the move to map epoch {} {}: {}",
                     epoch, committed ? "committed" : "aborted",
                     s.error_message());
    absl::SleepFor(absl::Milliseconds(100) * (i + 1));
  }
  // The source asks (MoveState) once its fence is old.
}

absl::StatusOr<MoveStateResponse> SlotMover::State(
    const MoveStateRequest& request) {
  // A backup's word could be older than its primary's decision.
  if (absl::Status s = CheckPrimary(); !s.ok()) return s;
  const uint64_t move_epoch = request.move_epoch();
  MoveStateResponse out;
  absl::MutexLock l(&mu_);
  last_word_[move_epoch] = Now();
  auto it = incoming_.find(move_epoch);
  if (request.confirm()) {
    out.set_copying(moving_in_ && it != incoming_.end() &&
                    it->second == Outcome::kCopying);
    return out;
  }
  if (it == incoming_.end()) {
    // Not known to this process (it restarted, or was promoted): its files
    // (or the entries it applied) say.
    const bool committed = c_->store->map_epoch() >= move_epoch;
    incoming_[move_epoch] = committed ? Outcome::kCommitted : Outcome::kAborted;
    out.set_committed(committed);
    return out;
  }
  if (it->second == Outcome::kCommitting) {
    return absl::UnavailableError(absl::StrCat(
        "the move to map epoch ", move_epoch, " is committing; ask again"));
  }
  if (it->second == Outcome::kCopying) it->second = Outcome::kAborted;
  out.set_committed(it->second == Outcome::kCommitted);
  return out;
}

// ---------------------------------------------------------------- source

absl::Status SlotMover::CheckLeaving(const ExportSlotsRequest& request,
                                     const ShardMap& next) {
  if (absl::Status s = CheckPrimary(); !s.ok()) return s;
  if (request.run_id() != c_->run_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("the destination is of run \"", request.run_id(),
                     "\", this shard of run \"", c_->run_id, "\""));
  }
  absl::MutexLock l(&mu_);
  if (moving_in_) {
    return absl::FailedPreconditionError(
        "this shard is taking slots in; one move at a time");
  }
  // A round of another move (another epoch, or the same epoch asked by
  // another destination) is not answered from this fence.
  if (leaving_.has_value() &&
      (leaving_->next.epoch() != next.epoch() ||
       leaving_->destination != request.destination())) {
    return absl::FailedPreconditionError(
        absl::StrCat("this shard is fenced for the move to map epoch ",
                     leaving_->next.epoch(), " to ", leaving_->destination));
  }
  return absl::OkStatus();
}

absl::Status SlotMover::Export(
    const ExportSlotsRequest& request,
    const std::function<bool(const ExportSlotsChunk&)>& write) {
  absl::StatusOr<ShardMap> next =
      ShardMapOr(request.next_map(), request.next_map().num_shards());
  if (!next.ok()) return next.status();
  absl::Status s = CheckLeaving(request, *next);
  if (!s.ok()) return s;
  const ShardMap current = c_->store->map();
  absl::StatusOr<std::vector<uint32_t>> slots =
      SlotsMoving(current, *next, c_->shard_index, request.destination_index());
  if (!slots.ok()) return slots.status();
  // The fence goes up once; a repeated fenced round (its answer was lost)
  // is answered from the fenced state: nothing changed since.
  bool raise = false;
  if (request.fence()) {
    bool fenced;
    {
      absl::MutexLock l(&mu_);
      fenced = leaving_.has_value();
    }
    // Only for a destination that says it is copying this move: a fence
    // asked by anyone else (naming a destination that does not answer)
    // would hold the slots until that destination answers.
    if (!fenced) s = ConfirmDestination(next->epoch(), request.destination());
    if (!s.ok()) return s;
    absl::MutexLock l(&mu_);
    if (!leaving_.has_value()) {
      leaving_ = Leaving{*next, request.destination(),
                         request.destination_index(), Now()};
      raise = true;
    }
  }
  if (raise) {
    // On a replicated shard every counted backup holds the fence before
    // the fenced round goes out: a backup promoted once the destination
    // may have committed stays fenced and asks how the move ended.
    MoveStep step = MoveStepTo(*next);
    step.mutable_fenced()->set_destination_index(request.destination_index());
    step.mutable_fenced()->set_destination(request.destination());
    s = Step(
        std::move(step), [&](const MoveStep& st) { return FenceBody(st); },
        /*acked=*/true);
    if (!s.ok()) return s;
    c_->logger->info(
        "fenced for the move of {} slots to shard {} (map epoch {}): the "
        "last changes go",
        slots->size(), request.destination_index(), next->epoch());
  }
  return SendRound(request, current, *slots, write);
}

absl::Status SlotMover::SendRound(
    const ExportSlotsRequest& request, const ShardMap& current,
    const std::vector<uint32_t>& slots,
    const std::function<bool(const ExportSlotsChunk&)>& write) {
  // The slots are captured in a few groups, each sent before the next is
  // read: the source holds one group's records at a time, not the whole
  // round's, and reuses their memory (fresh pages cost the kernel's
  // zeroing). The round's next_since is the first group's: what changed
  // after that is stamped later and goes in the next round.
  ExportSlotsChunk chunk;
  size_t bytes = 0;
  uint32_t next_since = 0;
  // Paced (--move_copy_mb_s) before the fence only: a fenced round holds
  // the slots' pulls and pushes until it is done.
  const double rate = request.fence() ? 0 : o_.copy_mb_s * 1e6;
  const absl::Time start = Now();
  double sent = 0;
  const auto send = [&]() -> bool {
    if (!write(chunk)) return false;
    sent += static_cast<double>(bytes);
    if (rate > 0) {
      const absl::Time due = start + absl::Seconds(sent / rate);
      if (due > Now()) absl::SleepFor(due - Now());
    }
    return true;
  };
  const size_t per_group =
      std::max<size_t>(1, (slots.size() + kCaptureGroups - 1) / kCaptureGroups);
  for (size_t first = 0; first < slots.size(); first += per_group) {
    const absl::Span<const uint32_t> part = absl::MakeConstSpan(slots).subspan(
        first, std::min(per_group, slots.size() - first));
    absl::StatusOr<SlotSet> group = SlotSet::Of(current, part);
    if (!group.ok()) return group.status();
    absl::StatusOr<SlotCapture> capture =
        CaptureSlots(c_->store, *group, request.since());
    if (!capture.ok()) return capture.status();
    if (first == 0) next_since = capture->next_since;
    for (std::string& r : capture->records) {
      if (bytes > 0 && bytes + r.size() > kChunkBytes) {
        if (!send()) return absl::CancelledError("the destination left");
        chunk.Clear();
        bytes = 0;
      }
      bytes += r.size();
      chunk.add_records(std::move(r));
    }
  }
  chunk.set_last(true);
  chunk.set_next_since(next_since);
  if (request.fence()) {
    // Read after the fence went up; clocks that move on meanwhile reach
    // the destination with the workers' next calls.
    for (const MovedWorkerRecord& w : c_->workers->ExportMoved()) {
      WorkerToProto(w, chunk.add_workers());
    }
  }
  if (!write(chunk)) return absl::CancelledError("the destination left");
  return absl::OkStatus();
}

absl::Status SlotMover::Finish(const FinishMoveRequest& request) {
  std::string destination;
  int destination_index = 0;
  {
    absl::MutexLock l(&mu_);
    if (!leaving_.has_value() ||
        leaving_->next.epoch() != request.move_epoch()) {
      // Told twice (a retried FinishMove, or MoveState answered first):
      // the outcome stands.
      if (!request.committed() ||
          c_->store->map_epoch() >= request.move_epoch()) {
        return absl::OkStatus();
      }
      return absl::FailedPreconditionError(
          absl::StrCat("no move to map epoch ", request.move_epoch(),
                       " is fenced on this shard"));
    }
    destination = leaving_->destination;
    destination_index = leaving_->destination_index;
  }
  // The word is only a hint: the destination, which decides, is asked, so
  // that no other caller can end the fence either way.
  return AskDestination(request.move_epoch(), destination, destination_index);
}

absl::StatusOr<MoveStateResponse> SlotMover::CallMoveState(
    const std::string& destination, uint64_t epoch, bool confirm) const {
  auto stub = SlotMoves::NewStub(MakeChannel(destination, 0, o_.security));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + o_.fence_timeout));
  MoveStateRequest request;
  request.set_move_epoch(epoch);
  request.set_confirm(confirm);
  MoveStateResponse response;
  const absl::Status s =
      FromGrpcStatus(stub->MoveState(&ctx, request, &response));
  if (!s.ok()) return s;
  return response;
}

absl::Status SlotMover::ConfirmDestination(uint64_t epoch,
                                           const std::string& destination) {
  const absl::StatusOr<MoveStateResponse> r =
      CallMoveState(destination, epoch, /*confirm=*/true);
  if (r.ok() && r->copying()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "not fencing for the move to map epoch ", epoch, ": the destination ",
      destination, " does not confirm it is copying it (",
      r.ok() ? "it is not" : r.status().ToString(), ")"));
}

absl::Status SlotMover::AskDestination(uint64_t epoch, std::string destination,
                                       int destination_index) {
  if (o_.primary_of) {
    // The destination group's primary may have changed since the move.
    absl::StatusOr<std::string> primary = o_.primary_of(destination_index);
    if (primary.ok() && !primary->empty()) destination = *std::move(primary);
  }
  const absl::StatusOr<MoveStateResponse> response =
      CallMoveState(destination, epoch, /*confirm=*/false);
  const absl::Status s = response.status();
  if (!s.ok()) {
    c_->logger->warn(
        "fenced for the move to map epoch {}; the destination {} does not "
        "say how it ended ({}); asking again",
        epoch, destination, s.ToString());
    return s;
  }
  return EndLeaving(epoch, response->committed());
}

absl::Status SlotMover::EndLeaving(uint64_t epoch, bool committed) {
  absl::MutexLock end(&end_mu_);
  MoveStep step;
  absl::Time fenced_at;
  {
    absl::MutexLock l(&mu_);
    // Ended already (the watcher and FinishMove both asked): it stands.
    if (!leaving_.has_value() || leaving_->next.epoch() != epoch) {
      return absl::OkStatus();
    }
    step = MoveStepTo(leaving_->next);
    fenced_at = leaving_->fenced_at;
  }
  step.mutable_ended()->set_committed(committed);
  const absl::Status s = Step(
      std::move(step), [&](const MoveStep& st) { return EndBody(st); },
      /*acked=*/false);
  if (!s.ok()) {
    // Still fenced (rather than serve slots that moved): asked again.
    c_->logger->error("ending the fence of the move to map epoch {}: {}", epoch,
                      s.ToString());
    return s;
  }
  c_->logger->info("the move to map epoch {} {}; serving again after {:.1f} ms",
                   epoch, committed ? "committed" : "was aborted",
                   Ms(Now() - fenced_at));
  return absl::OkStatus();
}

void SlotMover::Watch() {
  // Between two catch-ups with the run's map record; and between two
  // looks at it when nothing asked (a shard no request reaches, one that
  // owns no slot, may have missed a map too).
  constexpr absl::Duration kCatchUpEvery = absl::Milliseconds(500);
  constexpr absl::Duration kLookEvery = absl::Seconds(5);
  absl::MutexLock l(&mu_);
  absl::Time next_ask = Now() + o_.fence_timeout / 2;
  absl::Time next_look = o_.run_map_record != nullptr ? Now() + kLookEvery
                                                      : absl::InfiniteFuture();
  while (!stop_) {
    if (Now() >= next_look) {
      next_look = Now() + kLookEvery;
      catch_up_wanted_.store(true);
    }
    absl::Time until = std::min(next_ask, next_look);
    if (catch_up_wanted_.load()) until = std::min(until, next_catch_up_);
    const uint64_t seen = wakes_;
    AwaitSteadily(&mu_, &watcher_cv_, until - Now(),
                  [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                    return stop_ || wakes_ != seen;
                  });
    if (stop_) break;
    const absl::Time now = Now();
    if (catch_up_wanted_.load() && now >= next_catch_up_) {
      catch_up_wanted_.store(false);
      next_catch_up_ = now + kCatchUpEvery;
      mu_.Unlock();
      CatchUpWithRun();
      mu_.Lock();
      continue;
    }
    if (now < next_ask) continue;
    next_ask = now + o_.fence_timeout / 2;
    // A backup's fence ends with its primary's entry.
    if (!leaving_.has_value() || now - leaving_->fenced_at < o_.fence_timeout ||
        CheckPrimary().ok() == false) {
      continue;
    }
    const uint64_t epoch = leaving_->next.epoch();
    const std::string destination = leaving_->destination;
    const int destination_index = leaving_->destination_index;
    mu_.Unlock();
    AskDestination(epoch, destination, destination_index).IgnoreError();
    mu_.Lock();
  }
}

// ---------------------------------------------------------------- any shard

bool SlotMover::Moving() const {
  absl::MutexLock l(&mu_);
  return moving_in_ || leaving_.has_value();
}

std::string SlotMover::Describe() const {
  absl::MutexLock l(&mu_);
  if (leaving_.has_value()) {
    return absl::StrFormat(
        "fenced for %.0f ms: slots moving to %s (map epoch %d)",
        Ms(Now() - leaving_->fenced_at), leaving_->destination,
        leaving_->next.epoch());
  }
  return moving_in_ ? moving_in_what_ : std::string();
}

}  // namespace asyncps
