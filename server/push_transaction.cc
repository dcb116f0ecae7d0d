#include "server/push_transaction.h"

#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/shard_map.h"
#include "common/shard_map_proto.h"

namespace asyncps {

PushTransaction::PushTransaction(const ServiceContext& context,
                                 const PushRequest& request, uint64_t epoch)
    : c_(context),
      epoch_(epoch != 0 ? epoch : context.epoch),
      request_(request),
      pass_(context.gate, request.worker().worker_id()) {}

PushTransaction::~PushTransaction() {
  // Dropped before Commit: the prepared push (if any) goes back untouched
  // (its rows' memory and the eviction lock first, so that a retry waiting
  // for this seq finds them free), then the seq may be tried again.
  prepared_.reset();
  if (claim_.has_value() && !committed_) {
    c_.workers->FinishPush(&*claim_, /*applied=*/false);
  }
}

absl::Status PushTransaction::CheckCaller(const PushRequest& request) {
  absl::Status s = CheckWorkerRef(request.worker());
  if (!s.ok()) return s;
  if (request.seq() == 0) {
    return absl::InvalidArgumentError("push seq must be > 0");
  }
  if (request.has_then_pull()) {
    return absl::InvalidArgumentError(
        "then_pull rides only on StepStream, not on Push or PushStream");
  }
  if (request.moved_from_size() > kMaxOrigins) {
    return absl::InvalidArgumentError(
        absl::StrCat("push moved_from names ", request.moved_from_size(),
                     " origins (at most ", kMaxOrigins, ")"));
  }
  for (const PushOrigin& o : request.moved_from()) {
    if (o.seq() == 0 || o.shard() >= ShardMap::kMaxShards) {
      return absl::InvalidArgumentError(absl::StrCat(
          "push moved_from names shard ", o.shard(), " seq ", o.seq(),
          " (a shard below ", ShardMap::kMaxShards, " and a seq > 0 needed)"));
    }
  }
  return absl::OkStatus();
}

absl::Status PushTransaction::Prepare(absl::Span<const Payload> grads,
                                      absl::Span<const Payload> rows) {
  const WorkerRef& ref = request_.worker();
  // Who is calling, before anything of the payload is looked at.
  absl::Status caller = CheckCaller(request_);
  if (!caller.ok()) {
    c_.stats->RecordBadInput();
    return caller;
  }
  if (!c_.workers->IsCurrent(ref)) {
    // Routed by this shard's map? (A known caller's retry is recognised as
    // a duplicate first, below.)
    absl::Status routed = CheckServing(c_, request_.map_epoch());
    if (!routed.ok()) return routed;
    // A caller the registry does not know (yet): the push is checked as far
    // as it can be without it before the caller is registered, so that a
    // refused push registers nobody. (Known callers skip this: a retried
    // duplicate is recognised before its payload is looked at.) Checked as
    // a restored push would be: read versions may be from the future, no
    // memory is reserved.
    absl::Status s =
        c_.store->PreparePush(request_, grads, rows, PushMode::kRefuseRestored)
            .status();
    if (!s.ok()) {
      c_.stats->RecordBadInput();
      c_.logger->debug("push from unregistered worker {} refused: {}",
                       ref.worker_id(), s.ToString());
      return s;
    }
  }
  // Is the caller current (fencing), and was this push applied before?
  // Both before a known caller's payload is looked at.
  absl::InlinedVector<PushOriginRef, 2> origins;
  for (const PushOrigin& o : request_.moved_from()) {
    origins.push_back({o.shard(), o.seq()});
  }
  absl::StatusOr<WorkerRegistry::PushClaim> claim =
      c_.workers->BeginPush(ref, request_.seq(), origins);
  if (!claim.ok()) {
    if (absl::IsInvalidArgument(claim.status())) c_.stats->RecordBadInput();
    return claim.status();
  }
  claim_ = *std::move(claim);
  if (claim_->duplicate()) return absl::OkStatus();
  // Routed by this shard's map now? Read at this point: a map adopted
  // meanwhile refuses the push (nothing applied; the destructor gives the
  // seq back).
  absl::Status routed = CheckServing(c_, request_.map_epoch());
  if (!routed.ok()) {
    c_.logger->debug("push from worker {} refused: {}", ref.worker_id(),
                     routed.ToString());
    return routed;
  }
  // Parameters read from an earlier process of this shard were replaced by
  // a restore: such gradients are refused, whatever their versions say (an
  // assign was read from nothing).
  const bool restored = !request_.assign() && request_.read_epoch() != 0 &&
                        request_.read_epoch() != epoch_;
  absl::StatusOr<ShardStore::PreparedPush> prepared = c_.store->PreparePush(
      request_, grads, rows,
      restored ? PushMode::kRefuseRestored : PushMode::kApply);
  if (!prepared.ok()) {
    if (!absl::IsResourceExhausted(prepared.status()))
      c_.stats->RecordBadInput();
    c_.logger->debug("push from worker {} refused: {}", ref.worker_id(),
                     prepared.status().ToString());
    return prepared.status();
  }
  prepared_ = *std::move(prepared);
  return absl::OkStatus();
}

bool PushTransaction::duplicate() const {
  return claim_.has_value() && claim_->duplicate();
}

void PushTransaction::Commit(PushResponse* response) {
  if (committed_ || !prepared_.has_value()) return;
  committed_ = true;
  c_.store->CommitPush(&*prepared_, c_.rule, response);
  // Settled either way (applied or refused as restored): a retry gets the
  // same answer.
  c_.workers->FinishPush(&*claim_, /*applied=*/true);
}

}  // namespace asyncps
