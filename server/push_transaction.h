#ifndef ASYNCPS_SERVER_PUSH_TRANSACTION_H_
#define ASYNCPS_SERVER_PUSH_TRANSACTION_H_

// The push path of a shard, one object per push: PushTransaction checks a
// PushRequest whole (caller identity, seq de-duplication, slices, rows,
// memory) before applying any of it, and keeps checkpoints out meanwhile.
// PsService runs one for every Push and PushStream request; the class
// comment lists the rules it keeps.
//
// Example (a unary Push; PushStream reads the payloads from its frame,
// common/fast_frame.h):
//
//   absl::Status DoPush(const ServiceContext& context,
//                       const PushRequest& request, PushResponse* response) {
//     const std::vector<Payload> grads = ShardStore::PayloadsOf(request);
//     const std::vector<Payload> rows = TableStore::PayloadsOf(request);
//     PushTransaction push(context, request);  // holds the checkpoint gate
//     absl::Status s = push.Prepare(grads, rows);
//     if (!s.ok()) return s;  // nothing applied; a retry may try again
//     if (push.duplicate()) {
//       response->set_duplicate(true);  // applied before: acknowledge only
//     } else {
//       push.Commit(response);  // applies; cannot fail
//     }
//     return absl::OkStatus();
//   }

#include <optional>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/payload.h"
#include "common/shard_map.h"
#include "proto/asyncps.pb.h"
#include "server/push_gate.h"
#include "server/service_context.h"
#include "server/worker_registry.h"
#include "store/shard_store.h"

namespace asyncps {

// One push on a shard, from its first check to its effect, as a type that
// keeps the push's safety rules:
//   - at most one apply per (worker, incarnation, seq): the sequence number
//     is claimed before the payload is looked at, and a retry that comes
//     while its original is being applied waits for it, then is a
//     duplicate;
//   - checkpoints see whole pushes: the checkpoint gate is held from the
//     first check until the push is committed or dropped;
//   - nothing can fail after anything was applied: every check (slices,
//     rows, the new rows' memory) happens in Prepare, and Commit cannot
//     fail;
//   - a push that fails before Commit leaves nothing applied, and its seq
//     is given back (a retry may try again).
//
//   PushTransaction push(context, request);       // takes the gate
//   absl::Status s = push.Prepare(grads, rows);  // claims the seq, checks
//   if (!s.ok()) return s;                        // dropped: nothing applied
//   if (!push.duplicate()) push.Commit(response); // applies, settles the seq
//
// Bad input is counted (ShardStats::RecordBadInput) and logged by Prepare.
// Thread-compatible; one per push, on the calling thread.
class PushTransaction {
 public:
  // Holds the checkpoint gate until destroyed. `context` and `request`
  // must outlive the transaction. `epoch`: the shard's epoch that reads
  // must come from (0 = context.epoch; a replica's may change once, when it
  // takes its primary's).
  PushTransaction(const ServiceContext& context, const PushRequest& request,
                  uint64_t epoch = 0);
  // Not committed: gives the claimed seq back (nothing was applied).
  ~PushTransaction();
  PushTransaction(const PushTransaction&) = delete;
  PushTransaction& operator=(const PushTransaction&) = delete;

  // The checks of a push's caller that need no registry: a well-formed
  // worker reference (CheckWorkerRef), seq > 0, no then_pull (StepStream
  // takes it out first) and at most kMaxOrigins well-formed moved_from
  // origins, INVALID_ARGUMENT naming them otherwise. The first check of
  // every push, before its header's other fields or its payload are looked
  // at; Prepare makes it too.
  static absl::Status CheckCaller(const PushRequest& request);
  static constexpr int kMaxOrigins = 8;

  // grads[i] is the payload of request.grads(i), rows[k] of
  // request.rows(k); they must outlive the transaction. The caller is
  // checked first (CheckCaller), whatever the payload holds; then a caller
  // the registry does not know has the map it routed with checked and the
  // push checked, so that a refused push registers nobody; then the caller
  // is admitted and the seq claimed (FAILED_PRECONDITION for a replaced
  // incarnation); a duplicate is ready at once (nothing to check: a retry
  // of a push applied under an older map is acknowledged, not refused);
  // otherwise the map the push was routed with is checked against the
  // shard's map now (CheckRouted in common/shard_map_proto.h: an older one
  // is FAILED_PRECONDITION carrying the shard's map, a newer one
  // UNAVAILABLE; the seq is given back), then the whole push is prepared
  // (ShardStore::PreparePush: NOT_FOUND, INVALID_ARGUMENT,
  // RESOURCE_EXHAUSTED). Called once.
  absl::Status Prepare(absl::Span<const Payload> grads,
                       absl::Span<const Payload> rows);

  // After Prepare returned OK: the push was applied before; acknowledge it,
  // apply nothing.
  bool duplicate() const;

  // After Prepare returned OK on a push that is not a duplicate: applies it
  // (or, when it was read from an earlier process of this shard, refuses
  // every slice and row as REFUSED_RESTORED), fills `response`, settles the
  // seq and moves the worker's clock. Cannot fail. Called once.
  void Commit(PushResponse* response);

 private:
  const ServiceContext& c_;
  const uint64_t epoch_;
  const PushRequest& request_;
  PushGate::Pass pass_;
  std::optional<WorkerRegistry::PushClaim> claim_;
  std::optional<ShardStore::PreparedPush> prepared_;
  bool committed_ = false;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_PUSH_TRANSACTION_H_
