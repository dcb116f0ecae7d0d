#include "tools/live_moves.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/grpc_status.h"
#include "common/map_change.h"
#include "common/net.h"
#include "common/shard_map_proto.h"
#include "proto/asyncps.grpc.pb.h"
#include "proto/slot_moves.grpc.pb.h"

namespace asyncps {
namespace {

// The slots each (from, to) pair of shards moves, in order.
std::map<std::pair<int, int>, std::vector<uint32_t>> MovesBetween(
    const ShardMap& current, const ShardMap& target) {
  std::map<std::pair<int, int>, std::vector<uint32_t>> moves;
  const absl::Span<const uint16_t> a = current.owners();
  const absl::Span<const uint16_t> b = target.owners();
  for (size_t s = 0; s < a.size(); ++s) {
    if (a[s] != b[s]) {
      moves[{a[s], b[s]}].push_back(static_cast<uint32_t>(s));
    }
  }
  return moves;
}

// Tells every shard but `skip_a` and `skip_b` the map (best effort: a shard
// that misses it answers UNAVAILABLE to clients of the new map until it
// has it; the next move or psctl adopt brings it). Returns the shards that
// did not take it.
int Broadcast(const LiveMoveOptions& o, const ShardMap& map, int skip_a,
              int skip_b) {
  int failed = 0;
  AdoptMapRequest request;
  ShardMapToProto(map, request.mutable_map());
  request.set_remake_lost(o.remake_lost);
  const std::vector<int>& serving = map.serving_shards();
  for (int s = 0; s < static_cast<int>(o.servers.size()); ++s) {
    if (s == skip_a || s == skip_b) continue;
    // A shard that owns no slot may be stopped (psctl scale): one that is
    // down is no failure (it learns the map when it starts, from psctl
    // adopt or the next move); one that answers takes the map.
    const bool may_be_down =
        !std::binary_search(serving.begin(), serving.end(), s);
    // A group no process holds yet (declared in etcd as room to grow).
    if (o.servers[s].empty()) {
      if (may_be_down) continue;
      ++failed;
      std::fprintf(stderr,
                   "psctl: warning: shard %d did not adopt map epoch %llu: "
                   "no process holds it\n",
                   s, static_cast<unsigned long long>(map.epoch()));
      continue;
    }
    auto stub = SlotMoves::NewStub(MakeChannel(o.servers[s], 0, o.security));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    AdoptMapResponse response;
    const grpc::Status st = stub->AdoptMap(&ctx, request, &response);
    if (!st.ok() && may_be_down &&
        st.error_code() == grpc::StatusCode::UNAVAILABLE) {
      continue;
    }
    if (!st.ok()) {
      ++failed;
      std::fprintf(stderr,
                   "psctl: warning: shard %d did not adopt map epoch %llu: "
                   "%s\n",
                   s, static_cast<unsigned long long>(map.epoch()),
                   st.error_message().c_str());
    }
  }
  return failed;
}

// How the move to map epoch `epoch` ended, as the destination at
// `address`, which decides, says (MoveState: one still copying is aborted
// by the question). Not the map it serves: a replicated destination's
// primary serves the new map from its commit on, before its backups hold
// it, and a primary that loses its role then never committed it. Asked a
// few times while the commit waits for the backups (UNAVAILABLE).
absl::StatusOr<bool> MoveOutcome(const LiveMoveOptions& o,
                                 const std::string& address, uint64_t epoch) {
  auto stub = SlotMoves::NewStub(MakeChannel(address, 0, o.security));
  MoveStateRequest request;
  request.set_move_epoch(epoch);
  absl::Status s;
  for (int i = 0; i < 5; ++i) {
    if (i > 0) absl::SleepFor(absl::Seconds(1));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    MoveStateResponse r;
    s = FromGrpcStatus(stub->MoveState(&ctx, request, &r));
    if (s.ok()) return r.committed();
    if (!absl::IsUnavailable(s)) break;
  }
  return s;
}

// After MoveSlots failed: whether the move committed anyway (its answer was
// lost), as the destination says. Prints what happened.
bool CommittedAnyway(const LiveMoveOptions& o, int from, int to, size_t slots,
                     const ShardMap& next, const absl::Status& error) {
  std::fprintf(stderr,
               "psctl: moving %zu slots from shard %d to shard %d: %s\n", slots,
               from, to, error.ToString().c_str());
  // A refusal (a move tried already, a bad plan, one aborted by its
  // source's question) is the destination's answer: nothing moved. Only a
  // call that may have ended anywhere (no answer) is asked about; asking
  // would also hold off the next try of an aborted move (the destination
  // waits for questions about it to end).
  if (!absl::IsUnavailable(error) && !absl::IsDeadlineExceeded(error) &&
      !absl::IsCancelled(error) && !absl::IsUnknown(error)) {
    std::fprintf(stderr,
                 "psctl: the move was aborted: the destination refused it, "
                 "nothing moved\n");
    return false;
  }
  const absl::StatusOr<bool> committed =
      MoveOutcome(o, o.servers[to], next.epoch());
  if (!committed.ok()) {
    std::fprintf(
        stderr,
        "psctl: the destination (shard %d) does not answer how the "
        "move ended (%s): it decides (the source stays fenced until it "
        "says); once it does, psctl adopt brings every shard to the "
        "map it ended with\n",
        to, committed.status().ToString().c_str());
    return false;
  }
  if (*committed) {
    std::fprintf(stderr,
                 "psctl: the destination committed the move to map epoch "
                 "%llu (its answer was lost)\n",
                 static_cast<unsigned long long>(next.epoch()));
    return true;
  }
  std::fprintf(stderr,
               "psctl: the move was aborted (map epoch %llu): nothing moved\n",
               static_cast<unsigned long long>(next.epoch()));
  return false;
}

}  // namespace

absl::StatusOr<ShardMap> NewestMap(const std::vector<ShardResult>& results,
                                   int* code) {
  std::optional<ShardMap> newest;
  for (const ShardResult& r : results) {
    if (!r.up) continue;
    absl::StatusOr<ShardMap> m =
        ShardMapOr(r.status.map(), r.status.num_shards());
    if (!m.ok()) return m.status();
    if (newest.has_value() && (m->num_slots() != newest->num_slots() ||
                               m->num_shards() != newest->num_shards())) {
      return absl::FailedPreconditionError(
          absl::StrCat("shard ", r.index, " serves the ", m->DebugString(),
                       ", shard 0 the ", newest->DebugString()));
    }
    if (!newest.has_value() || m->epoch() > newest->epoch()) newest = *m;
  }
  // A shard down is fine only when it owns no slot (psctl scale drained
  // it, or it waits as a standby): nothing it holds can move or be lost.
  for (const ShardResult& r : results) {
    if (r.up) continue;
    if (!newest.has_value() || !newest->slotted() ||
        std::count(newest->owners().begin(), newest->owners().end(), r.index) >
            0) {
      return absl::UnavailableError(
          absl::StrCat("shard ", r.index, " (", r.address, "): ", r.error));
    }
  }
  if (!newest->slotted()) *code = kExitUsage;
  return *newest;
}

std::vector<bool> OwningNoSlot(const std::vector<ShardResult>& results) {
  std::vector<bool> none(results.size(), false);
  std::optional<ShardMap> newest;
  for (const ShardResult& r : results) {
    if (!r.up) continue;
    absl::StatusOr<ShardMap> m =
        ShardMapOr(r.status.map(), r.status.num_shards());
    if (m.ok() && (!newest.has_value() || m->epoch() > newest->epoch())) {
      newest = *std::move(m);
    }
  }
  if (!newest.has_value() || !newest->slotted()) return none;
  for (size_t i = 0; i < results.size(); ++i) {
    const int s = results[i].index;
    none[i] =
        s >= 0 && s < newest->num_shards() && newest->ServingPosition(s) < 0;
  }
  return none;
}

absl::StatusOr<std::vector<uint32_t>> ParseSlotList(const std::string& text) {
  std::vector<uint32_t> slots;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<absl::string_view> ends = absl::StrSplit(part, '-');
    uint32_t first = 0, last = 0;
    if (ends.size() > 2 || !absl::SimpleAtoi(ends[0], &first) ||
        !absl::SimpleAtoi(ends.back(), &last) || last < first ||
        last - first >= static_cast<uint32_t>(ShardMap::kMaxSlots)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad slot or range '", part,
                       "' (expected N or FIRST-LAST, comma-separated)"));
    }
    for (uint32_t s = first; s <= last; ++s) slots.push_back(s);
  }
  if (slots.empty()) return absl::InvalidArgumentError("no slots given");
  return slots;
}

int RunLiveMoves(const LiveMoveOptions& o, const ShardMap& current,
                 const ShardMap& target) {
  if (target.num_slots() != current.num_slots() ||
      target.num_shards() != current.num_shards() ||
      static_cast<int>(o.servers.size()) != current.num_shards()) {
    return UsageError(absl::StrCat(
        "the target map (", target.DebugString(),
        ") is not one of the run's slots and shards (", current.DebugString(),
        ", ", o.servers.size(), " servers given)"));
  }
  for (const int s : target.serving_shards()) {
    if (!o.servers[s].empty()) continue;
    std::fprintf(stderr,
                 "psctl: shard %d has no process: start ps_server "
                 "--shard_index=%d with the run's etcd flags before slots "
                 "move to it\n",
                 s, s);
    return kExitDown;
  }
  // Shards behind (one restarted on files older than a move) first.
  if (Broadcast(o, current, -1, -1) > 0) return kExitDown;
  ShardMap now = current;
  Doc moves = Doc::Array();
  std::string text;
  int code = 0;
  for (const auto& [pair, slots] : MovesBetween(current, target)) {
    const auto [from, to] = pair;
    absl::StatusOr<ShardMap> next = WithSlotsMoved(now, slots, to);
    if (!next.ok()) return UsageError(std::string(next.status().message()));
    MoveSlotsRequest request;
    request.set_source(o.servers[from]);
    request.set_source_index(from);
    request.set_destination(o.servers[to]);
    // Shard 0 keeps the run's map record (a run with etcd keeps it there):
    // a map change planned from the same map as this one is refused.
    request.set_keeper(o.servers[0]);
    ShardMapToProto(*next, request.mutable_next_map());
    auto stub = SlotMoves::NewStub(MakeChannel(o.servers[to], 0, o.security));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + o.timeout));
    MoveSlotsResponse r;
    const absl::Time start = absl::Now();
    const absl::Status st = FromGrpcStatus(stub->MoveSlots(&ctx, request, &r));
    if (!st.ok()) {
      if (!CommittedAnyway(o, from, to, slots.size(), *next, st)) {
        code = kExitDown;
        break;
      }
      r.Clear();  // what it moved is in the destination's log
      r.set_slots(static_cast<uint32_t>(slots.size()));
    }
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    now = *next;
    Broadcast(o, now, from, to);
    moves.Add(Doc::Object()
                  .Set("from", Doc::Int(from))
                  .Set("to", Doc::Int(to))
                  .Set("slots", Doc::Int(r.slots()))
                  .Set("slices", Doc::Uint(r.slices()))
                  .Set("rows", Doc::Uint(r.rows()))
                  .Set("bytes", Doc::Uint(r.bytes()))
                  .Set("rounds", Doc::Int(r.rounds()))
                  .Set("copy_ms", Doc::Double(r.copy_ms()))
                  .Set("fence_ms", Doc::Double(r.fence_ms()))
                  .Set("epoch", Doc::Uint(now.epoch())));
    absl::StrAppendFormat(
        &text,
        "shard %d -> %d: %d slots (%d slices, %d rows), %.1f MB in %d rounds "
        "(%.0f MB/s), copy %.1f ms, fenced %.1f ms; map epoch %d\n",
        from, to, r.slots(), r.slices(), r.rows(), r.bytes() / 1e6, r.rounds(),
        seconds > 0 ? r.bytes() / 1e6 / seconds : 0.0, r.copy_ms(),
        r.fence_ms(), now.epoch());
  }
  if (o.format == Format::kJson || o.format == Format::kYaml) {
    Doc doc = Doc::Object();
    doc.Set("moves", std::move(moves))
        .Set("epoch", Doc::Uint(now.epoch()))
        .Set("complete", Doc::Bool(code == 0));
    Print(Render(doc, o.format));
  } else {
    if (text.empty() && code == 0) text = "nothing to move\n";
    Print(text);
  }
  return code;
}

int RunAdopt(const LiveMoveOptions& o, const ShardMap& newest) {
  const int failed = Broadcast(o, newest, -1, -1);
  if (o.format == Format::kJson || o.format == Format::kYaml) {
    Doc doc = Doc::Object();
    doc.Set("epoch", Doc::Uint(newest.epoch()))
        .Set("shards_failed", Doc::Int(failed));
    Print(Render(doc, o.format));
  } else if (failed == 0) {
    Print(absl::StrCat("every shard serves map epoch ", newest.epoch(), "\n"));
  }
  return failed == 0 ? 0 : kExitDown;
}

}  // namespace asyncps
