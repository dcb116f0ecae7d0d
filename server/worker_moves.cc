// Worker records that travel with a live slot move (server/slot_mover.h):
// the shard the slots leave exports its workers' identities and clocks in
// the fenced round, and the shard they go to imports them at the commit,
// so that SSP/BSP on the destination (a standby shard, say, that never
// heard from a slow worker) does not let a fast worker run ahead.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/shard_map.h"
#include "server/worker_registry.h"

namespace asyncps {

std::vector<MovedWorkerRecord> WorkerRegistry::ExportMoved() const {
  std::vector<MovedWorkerRecord> out;
  for (Worker* w : AllWorkers()) {
    absl::MutexLock l(&w->mu);
    if (w->incarnation == 0) continue;  // never admitted
    MovedWorkerRecord r;
    r.worker_id = w->id;
    r.incarnation = w->incarnation;
    r.retired = w->retired;
    r.clock = w->clock.load();
    r.trained = w->trained;
    r.live = w->live.load();
    r.left = w->left;
    r.applied_seqs = w->moved_seqs;
    r.applied_seqs[options_.shard_index] = AppliedSeqSet::Of(w->dedup);
    out.push_back(std::move(r));
  }
  return out;
}

absl::Status WorkerRegistry::CheckMoved(
    absl::Span<const MovedWorkerRecord> records) {
  for (const MovedWorkerRecord& r : records) {
    const auto holds = [&r](uint64_t inc) {
      return std::find(r.retired.begin(), r.retired.end(), inc) !=
             r.retired.end();
    };
    const bool zero_retired = holds(0);
    const bool self_retired = holds(r.incarnation);
    // Each shard's set counts as one more, so that many empty sets do
    // not pass either.
    size_t seqs = 0;
    for (const auto& [shard, set] : r.applied_seqs) {
      if (shard >= static_cast<uint32_t>(ShardMap::kMaxShards)) {
        return absl::InvalidArgumentError(
            absl::StrCat("moved worker record of id ", r.worker_id,
                         " carries applied seqs of shard ", shard));
      }
      seqs += 1 + set.applied().size();
    }
    if (seqs > kMaxMovedSeqs) {
      return absl::InvalidArgumentError(absl::StrCat(
          "moved worker record of id ", r.worker_id, " carries ", seqs,
          " applied seqs and shards (at most ", kMaxMovedSeqs, ")"));
    }
    if (r.worker_id < 0 || r.incarnation == 0 || zero_retired || self_retired ||
        r.clock < 0 || r.trained < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "moved worker record of id ", r.worker_id, " incarnation ",
          r.incarnation, " clock ", r.clock, " trained ", r.trained,
          zero_retired ? " (a replaced incarnation 0)" : "",
          self_retired ? " (its own incarnation among the replaced)" : "",
          " is malformed"));
    }
  }
  return absl::OkStatus();
}

absl::Status WorkerRegistry::ImportWorkers(
    absl::Span<const MovedWorkerRecord> records) {
  absl::Status s = CheckMoved(records);
  if (!s.ok()) return s;
  for (const MovedWorkerRecord& r : records) {
    Worker* w = FindOrAdd(r.worker_id);
    absl::MutexLock l(&w->mu);
    ImportMovedLocked(w, r);
  }
  // Clocks grew (and a replaced incarnation may have stopped counting):
  // waits may go ahead now, as after any clock change.
  ReleaseWaiters();
  return absl::OkStatus();
}

void WorkerRegistry::MergeMovedSeqs(Worker* w, const MovedWorkerRecord& r) {
  for (const auto& [shard, set] : r.applied_seqs) {
    // This shard's own window, sent back by a move of slots it had given
    // away: the window here holds all of it and more.
    if (shard == options_.shard_index) continue;
    w->moved_seqs[shard].Merge(set);
  }
}

void WorkerRegistry::AddRetired(Worker* w,
                                absl::Span<const uint64_t> incarnations) {
  for (uint64_t inc : incarnations) {
    if (std::find(w->retired.begin(), w->retired.end(), inc) !=
        w->retired.end()) {
      continue;
    }
    w->retired.push_back(inc);
  }
  const size_t keep = static_cast<size_t>(options_.retired_incarnations);
  if (w->retired.size() > keep) {
    w->retired.erase(w->retired.begin(), w->retired.end() - keep);
  }
}

void WorkerRegistry::ImportMovedLocked(Worker* w, const MovedWorkerRecord& r) {
  const absl::Time now = options_.clock->Now();
  const auto holds = [](const std::vector<uint64_t>& v, uint64_t inc) {
    return std::find(v.begin(), v.end(), inc) != v.end();
  };
  // The data position is the role's, across incarnations: the larger
  // stands whoever reported it.
  w->trained = std::max(w->trained, r.trained);
  if (w->incarnation == 0 || holds(r.retired, w->incarnation)) {
    // Unknown here, or the source saw this shard's incarnation replaced by
    // the record's: the record's process is the current one. A replaced
    // incarnation here is fenced as the source fences it.
    if (w->incarnation != 0) {
      RetireCurrent(w);
      options_.logger->info(
          "worker {}: incarnation {} (from a slot move) replaces {}", w->id,
          absl::StrFormat("%016x", r.incarnation),
          absl::StrFormat("%016x", w->incarnation));
    }
    w->incarnation = r.incarnation;
    AddRetired(w, r.retired);
    MergeMovedSeqs(w, r);
    w->clock.store(std::max(w->clock.load(), r.clock));
    w->live.store(r.live);
    w->left = r.left;
    w->last_seen_ns.store(absl::ToUnixNanos(now));
    return;
  }
  if (holds(w->retired, r.incarnation)) {
    // A process this shard saw replaced: its record changes nothing.
    return;
  }
  // The same incarnation, or another one neither shard saw replaced.
  // Incarnations are opaque (never ordered), so in the second case this
  // shard keeps the one it knows rather than fence a process that may be
  // the newer one; whichever calls here next is admitted by the usual
  // rules. The clock of a worker id never goes back across incarnations (a
  // restart resumes at least at its predecessor's), so the larger clock
  // stands in both cases.
  w->clock.store(std::max(w->clock.load(), r.clock));
  if (r.incarnation != w->incarnation) return;
  AddRetired(w, r.retired);
  MergeMovedSeqs(w, r);
  if (r.live && !w->live.load() && !w->left) {
    // Evicted here (silent to this shard), heard from there: it holds
    // others back again until its lease runs out.
    w->live.store(true);
    w->last_seen_ns.store(absl::ToUnixNanos(now));
  }
}

}  // namespace asyncps
