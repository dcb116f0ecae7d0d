#include "server/push_dedup.h"

#include "absl/strings/str_cat.h"

namespace asyncps {

absl::StatusOr<bool> PushDedup::RunOnce(const WorkerRef& worker, uint64_t seq,
                                        absl::FunctionRef<void()> apply) {
  Entry* e;
  {
    absl::MutexLock l(&mu_);
    auto& slot = entries_[worker.worker_id()];
    if (slot == nullptr) slot = std::make_unique<Entry>();
    e = slot.get();
  }
  absl::MutexLock l(&e->mu);
  if (e->any && worker.incarnation() < e->incarnation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "push from worker ", worker.worker_id(), " incarnation ",
        worker.incarnation(), " is older than the live incarnation ",
        e->incarnation));
  }
  if (e->any && worker.incarnation() == e->incarnation && seq <= e->last_seq) {
    return false;
  }
  apply();
  e->any = true;
  e->incarnation = worker.incarnation();
  e->last_seq = seq;
  return true;
}

}  // namespace asyncps
