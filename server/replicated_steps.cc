// PsService's state-changing steps, run directly or through the replica's
// log (ps_server --replicas; server/replication_log.h), and a backup's
// replay of its primary's entries.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "server/ps_service.h"
#include "store/table_store.h"

namespace asyncps {

absl::Status PsService::CheckPrimary() const {
  if (c_.log == nullptr || c_.log->primary()) return absl::OkStatus();
  if (c_.log->fenced()) {
    return absl::UnavailableError(absl::StrCat(
        "shard ", c_.shard_index,
        ": this replica was the primary and is fenced (a newer map or a lost "
        "lease); the shard map names the current primary"));
  }
  return absl::UnavailableError(
      absl::StrCat("shard ", c_.shard_index,
                   ": this replica is a backup; workers reach the primary "
                   "the shard map names"));
}

void PsService::RunStep(absl::FunctionRef<MadeEntry()> entry,
                        absl::FunctionRef<absl::Status()> apply,
                        std::function<void(absl::Status)> answer,
                        bool through_earlier) {
  if (c_.log == nullptr) return answer(apply());
  absl::Status applied;
  absl::StatusOr<uint64_t> index = c_.log->Run(entry, [&](LogEntry* e) {
    {
      absl::MutexLock l(&running_mu_);
      running_ = e;
    }
    applied = apply();
    absl::MutexLock l(&running_mu_);
    running_ = nullptr;
  });
  if (!index.ok()) return answer(index.status());
  c_.log->WhenAcked(*index - (through_earlier ? 1 : 0),
                    [applied, answer = std::move(answer)](absl::Status held) {
                      answer(held.ok() ? applied : held);
                    });
}

void PsService::RunPushStep(const PushRequest& request,
                            absl::Span<const Payload> grads,
                            absl::Span<const Payload> rows,
                            const FrameReader* frames, PushResponse* response,
                            std::function<void(absl::Status)> answer) {
  auto needs_checkpoint = std::make_shared<bool>(false);
  RunStep([&] { return PushEntry(request, grads, rows, frames); },
          [&] {
            return DoPush(request, grads, response, rows,
                          needs_checkpoint.get());
          },
          [this, needs_checkpoint, answer](absl::Status s) {
            if (!s.ok() || !*needs_checkpoint) return answer(s);
            WhenValuesDurable("the assign was applied", answer);
          });
}

void PsService::RunPullStep(const PullRequest& request,
                            absl::FunctionRef<absl::Status()> copy,
                            std::function<void(absl::Status)> answer) {
  RunStep(
      [&] {
        LogEntry entry;
        PullRequest* pull = entry.mutable_pull();
        *pull = request;
        return entry;
      },
      copy, std::move(answer), /*through_earlier=*/true);
}

namespace {

std::string Concat(const Payload& p) {
  std::string out;
  out.reserve(p.size());
  for (absl::string_view piece : p.pieces())
    out.append(piece.data(), piece.size());
  return out;
}

}  // namespace

MadeEntry PsService::PushEntry(const PushRequest& header,
                               absl::Span<const Payload> grads,
                               absl::Span<const Payload> rows,
                               const FrameReader* frames) {
  LogEntry entry;
  PushRequest* push = entry.mutable_push();
  *push = header;
  // The unary form carries its payloads inside the request; the entry
  // carries them once, outside.
  for (SliceGradient& g : *push->mutable_grads()) g.clear_grad();
  for (RowsGradient& r : *push->mutable_rows()) r.clear_grad();
  if (frames == nullptr) {
    for (const Payload& g : grads) entry.add_grads(Concat(g));
    for (const Payload& r : rows) entry.add_rows(Concat(r));
    return entry;
  }
  auto outside = std::make_shared<EntryPayloads>();
  for (const Payload& g : grads) outside->grads.push_back(frames->Keep(g));
  for (const Payload& r : rows) outside->rows.push_back(frames->Keep(r));
  return MadeEntry(std::move(entry), std::move(outside));
}

void PsService::NoteEviction(absl::string_view table,
                             absl::Span<const uint64_t> ids, bool idle) {
  absl::MutexLock l(&running_mu_);
  if (running_ == nullptr) {
    // A backup that had to make room itself: its state has left its
    // primary's (it evicts only what the entries say, which should leave
    // the room the primary had).
    if (unlogged_evictions_ == 0) {
      c_.logger->warn(
          "evicted {} row(s) of table {} outside a log entry: this replica's "
          "rows may differ from its primary's",
          ids.size(), QuoteName(table));
    }
    unlogged_evictions_ += ids.size();
    return;
  }
  EvictedRows* rows = running_->add_evicted();
  rows->set_table(std::string(table));
  rows->mutable_ids()->Add(ids.begin(), ids.end());
  rows->set_idle(idle);
}

uint64_t PsService::RunEviction(int64_t clock) {
  // Most rounds have nothing to do: no log entry for them.
  if (!c_.store->tables().EvictionDue(clock)) return 0;
  uint64_t evicted = 0;
  const auto evict = [&] {
    evicted = c_.store->tables().EvictToWatermark();
    evicted += c_.store->tables().EvictIdle(clock);
    return absl::OkStatus();
  };
  if (c_.log == nullptr) {
    evict().IgnoreError();
    return evicted;
  }
  // On a backup the log refuses the step: nothing is evicted.
  RunStep(
      [] {
        LogEntry entry;
        entry.mutable_evict();
        return entry;
      },
      evict, [](absl::Status) {});
  return evicted;
}

absl::Status PsService::ApplyEntry(const LogEntry& entry,
                                   const EntryPayloads* outside) {
  for (const EvictedRows& rows : entry.evicted()) {
    absl::StatusOr<uint64_t> n =
        c_.store->tables().EvictRows(rows.table(), rows.ids(), rows.idle());
    // Only a replica that left its primary's state lacks the table; the
    // request is applied all the same, as on the primary.
    if (!n.ok()) {
      c_.logger->warn("entry {}: {}", entry.index(), n.status().ToString());
    }
  }
  switch (entry.request_case()) {
    case LogEntry::kPush: {
      const WireDtype dtype = entry.push().wire_dtype();
      std::vector<Payload> grads, rows;
      for (const std::string& g : entry.grads()) grads.emplace_back(g, dtype);
      for (const std::string& r : entry.rows()) rows.emplace_back(r, dtype);
      if (outside != nullptr) {
        for (const auto& g : outside->grads)
          grads.push_back(PayloadOf(g, dtype));
        for (const auto& r : outside->rows) rows.push_back(PayloadOf(r, dtype));
      }
      PushResponse response;
      bool needs_checkpoint = false;
      return DoPush(entry.push(), grads, &response, rows, &needs_checkpoint);
    }
    case LogEntry::kPull: {
      // What a pull changes: the worker's admission, and rows it creates
      // or marks used; its tensors' values are not copied.
      int64_t target = 0;
      absl::Status s = BeginPull(entry.pull(), &target);
      if (!s.ok() || entry.pull().rows().empty()) return s;
      PullRequest rows = entry.pull();
      rows.clear_tensors();
      PullResponse response;
      return CopyPull(rows, &response);
    }
    case LogEntry::kCreate: {
      bool needs_checkpoint = false;
      return DoCreate(entry.create(), &needs_checkpoint).status();
    }
    case LogEntry::kRates: {
      SetLearningRateResponse response;
      return DoSetLearningRate(entry.rates(), &response);
    }
    case LogEntry::kHeartbeat: {
      HeartbeatResponse response;
      return DoHeartbeat(entry.heartbeat(), &response);
    }
    case LogEntry::kEvict:
      return absl::OkStatus();  // its rows were evicted above
    case LogEntry::kMove:
      if (!c_.apply_move) {
        return absl::FailedPreconditionError("this shard moves no slots");
      }
      return c_.apply_move(entry.move());
    case LogEntry::REQUEST_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("log entry ", entry.index(), " carries no request"));
}

}  // namespace asyncps
