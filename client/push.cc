// PsClient's pushes and assigns: a step's tensor slices and rows in one
// request per shard (one sequence number, one push transaction on each
// shard), tensor payloads sent from the caller's memory.
#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "absl/strings/str_cat.h"
#include "client/ps_client.h"
#include "client/ps_client_internal.h"
#include "client/push_split.h"
#include "common/fast_frame.h"
#include "common/names.h"
#include "common/payload.h"
#include "common/shard_map_proto.h"

namespace asyncps {

// gRPC's references to the gradient memory: one per slice handed over,
// dropped when gRPC releases that slice.
struct PsClient::Borrowed {
  absl::Mutex mu;
  int64_t refs ABSL_GUARDED_BY(mu) = 0;

  static void Release(void* self) {
    auto* b = static_cast<Borrowed*>(self);
    absl::MutexLock l(&b->mu);
    --b->refs;
  }
  static bool AllReleased(Borrowed* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(b->mu) {
    return b->refs == 0;
  }
};

namespace {

// The words of messages: a push of gradients or an assign of values.
struct SendKind {
  const char* what;
  const char* payload;
};

SendKind KindOf(bool assign) {
  return assign ? SendKind{"Assign", "values"} : SendKind{"Push", "gradient"};
}

// Adds one shard's answer to a tensor's or the push's outcome.
template <typename Outcome>
void Count(SliceOutcome outcome, int64_t n, Outcome* o) {
  switch (outcome) {
    case APPLIED:
      o->applied += n;
      break;
    case REFUSED_STALE:
      o->refused_stale += n;
      break;
    default:
      o->refused_restored += n;
  }
}

}  // namespace

// One table's rows of a push, checked and summed per distinct id before
// anything is sent.
struct PsClient::RowsSend {
  const TableState* table = nullptr;
  const RowsGrad* grad = nullptr;
  std::vector<uint32_t> first;  // per distinct id: its first position
  std::vector<float> sums;      // per distinct id: the summed row
};

PsClient::PendingPush::PendingPush() = default;

PsClient::PendingPush::~PendingPush() = default;

absl::StatusOr<PushSummary> PsClient::PendingPush::Finish(absl::Status s) {
  PushSummary summary;
  uint64_t staleness_sum = 0;
  // Per tensor: the outcome and how many staleness values it summed
  // (node_hash_map: its entries stay where they are as it grows).
  absl::node_hash_map<std::string, std::pair<TensorPushOutcome, int64_t>> per;
  for (auto& ps : shards_) {
    // Our own references to the gradient memory.
    ps->frame.Clear();
    ps->payload.clear();
    if (!s.ok()) continue;
    const PushResponse& r = ps->response;
    if (r.duplicate()) ++summary.duplicates;
    std::pair<TensorPushOutcome, int64_t>* t = nullptr;
    const std::string* t_name = nullptr;
    for (const SliceResult& res : r.results()) {
      if (t_name == nullptr || res.tensor() != *t_name) {
        t = &per[res.tensor()];
        t_name = &res.tensor();
      }
      Count(res.outcome(), 1, &summary);
      Count(res.outcome(), 1, &t->first);
      if (res.outcome() == REFUSED_RESTORED) continue;
      summary.max_staleness = std::max(summary.max_staleness, res.staleness());
      t->first.max_staleness =
          std::max(t->first.max_staleness, res.staleness());
      t->first.mean_staleness += static_cast<double>(res.staleness());
      ++t->second;
      staleness_sum += res.staleness();
    }
    for (const RowsResult& rows : r.row_results()) {
      Count(APPLIED, rows.applied(), &summary.rows);
      Count(REFUSED_STALE, rows.refused_stale(), &summary.rows);
      Count(REFUSED_RESTORED, rows.refused_restored(), &summary.rows);
      summary.rows_created += rows.rows_created();
      summary.max_staleness =
          std::max(summary.max_staleness, rows.max_staleness());
      staleness_sum += rows.staleness_sum();
    }
  }
  for (auto& [name, entry] : per) {
    if (entry.second > 0) entry.first.mean_staleness /= entry.second;
    summary.tensors.emplace(name, entry.first);
  }
  summary.applied += summary.rows.applied;
  summary.refused_stale += summary.rows.refused_stale;
  summary.refused_restored += summary.rows.refused_restored;
  // gRPC may still hold slices of a cancelled or failed attempt for a
  // moment; the caller may reuse its memory only after they are released.
  // A stream that ended holds them until it is deleted, which happens on a
  // caller's thread: on the stream's next Send, or here, for a stream that
  // gets none any more (its shard died or moved: a failover).
  while (borrowed_ != nullptr) {
    Borrowed* b = borrowed_.get();
    if (queue_->WaitUntil(absl::Milliseconds(20), [b] {
          absl::MutexLock l(&b->mu);
          return Borrowed::AllReleased(b);
        })) {
      break;
    }
    reap_();
  }
  if (!s.ok()) return s;
  const int64_t counted = summary.applied + summary.refused_stale;
  if (counted > 0) {
    summary.mean_staleness =
        static_cast<double>(staleness_sum) / static_cast<double>(counted);
  }
  return summary;
}

std::unique_ptr<PsClient::PendingPush> PsClient::StartPush(
    int64_t clock, const PushSet& what, const ReadSet& read) {
  return StartSend(/*assign=*/false, clock, what, read);
}

std::unique_ptr<PsClient::PendingPush> PsClient::StartAssign(
    int64_t clock, const PushSet& what) {
  return StartSend(/*assign=*/true, clock, what, ReadSet());
}

absl::Status PsClient::CheckTensorSend(
    bool assign, const PushSet& what, const ShardMap& map,
    std::vector<const TensorState*>* states) const {
  const SendKind k = KindOf(assign);
  absl::flat_hash_set<std::string> seen;
  for (const auto& [name, buffer] : what.tensors) {
    const TensorState* t = FindTensor(name);
    if (t == nullptr) {
      return absl::NotFoundError(
          absl::StrCat(k.what, ": unknown tensor ", QuoteName(name),
                       " (create it or wait for it first)"));
    }
    if (buffer == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(k.what, ": null ", k.payload, " buffer for tensor ",
                       QuoteName(name)));
    }
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(k.what, ": tensor ", QuoteName(name), " given twice"));
    }
    if (t->map_epoch != map.epoch()) {
      return absl::AbortedError("the map changed while the push was planned");
    }
    if (!what.tensors_checked_finite &&
        !AllFinite(reinterpret_cast<const char*>(buffer),
                   static_cast<size_t>(t->layout.num_elems()), WIRE_F32)) {
      return absl::InvalidArgumentError(absl::StrCat(
          k.what, ": the ", k.payload, " of tensor ", QuoteName(name),
          " contains NaN or Inf; nothing was sent"));
    }
    states->push_back(t);
  }
  return absl::OkStatus();
}

absl::Status PsClient::CheckRowsSend(bool assign, const PushSet& what,
                                     std::vector<RowsSend>* tables) const {
  const SendKind k = KindOf(assign);
  std::vector<const TableState*> seen;
  for (const RowsGrad& g : what.rows) {
    const TableState* t = FindTable(g.table);
    if (t == nullptr) {
      return absl::NotFoundError(
          absl::StrCat(k.what, ": unknown table ", QuoteName(g.table),
                       " (create it or wait for it first)"));
    }
    if (g.grads == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(k.what, ": null ", k.payload, " buffer for table ",
                       QuoteName(g.table)));
    }
    if (std::find(seen.begin(), seen.end(), t) != seen.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(k.what, ": table ", QuoteName(g.table), " given twice"));
    }
    seen.push_back(t);
    if (g.ids.empty()) continue;
    // A shard would refuse it while the others apply theirs: refused here,
    // before anything is sent.
    const size_t dim = static_cast<size_t>(t->spec.dim());
    if (!AllFinite(reinterpret_cast<const char*>(g.grads), g.ids.size() * dim,
                   WIRE_F32)) {
      return absl::InvalidArgumentError(absl::StrCat(
          k.what, ": the ", k.payload, " of table ", QuoteName(g.table),
          " contains NaN or Inf; nothing was sent"));
    }
    RowsSend send{t, &g, {}, {}};
    absl::flat_hash_map<uint64_t, uint32_t> index;
    index.reserve(g.ids.size());
    std::vector<uint32_t> unique_of(g.ids.size());
    for (size_t i = 0; i < g.ids.size(); ++i) {
      const auto [it, fresh] =
          index.try_emplace(g.ids[i], static_cast<uint32_t>(index.size()));
      if (fresh) {
        send.first.push_back(static_cast<uint32_t>(i));
      } else if (assign) {
        return absl::InvalidArgumentError(
            absl::StrCat(k.what, ": row ", g.ids[i], " of table ",
                         QuoteName(g.table), " given twice; nothing was sent"));
      }
      unique_of[i] = it->second;
    }
    // The gradients of repeated ids summed (an assign has none).
    send.sums.assign(send.first.size() * dim, 0.0f);
    for (size_t i = 0; i < g.ids.size(); ++i) {
      float* into = send.sums.data() + unique_of[i] * dim;
      const float* from = g.grads + i * dim;
      for (size_t d = 0; d < dim; ++d) into[d] += from[d];
    }
    tables->push_back(std::move(send));
  }
  return absl::OkStatus();
}

int64_t PsClient::AddTensorPayloads(
    const PushSet& what, const std::vector<const TensorState*>& states,
    const ReadSet& read, WireDtype dtype, const ShardMap& map, PendingPush* p,
    std::vector<PushRequest>* headers,
    std::vector<std::vector<grpc::Slice>>* payloads) const {
  int64_t total_elems = 0;
  for (const TensorState* t : states) total_elems += t->layout.num_elems();
  // The bytes sent: the caller's floats, or their bfloat16 copy.
  if (dtype == WIRE_BF16) p->bf16_.resize(static_cast<size_t>(total_elems));
  Borrowed* borrowed = p->borrowed_.get();
  int64_t bf16_at = 0;
  int64_t handed_over = 0;
  for (size_t k = 0; k < states.size(); ++k) {
    const TensorState& t = *states[k];
    const char* source = reinterpret_cast<const char*>(what.tensors[k].second);
    if (dtype == WIRE_BF16) {
      char* out = reinterpret_cast<char*>(p->bf16_.data() + bf16_at);
      EncodeBf16(what.tensors[k].second,
                 static_cast<size_t>(t.layout.num_elems()), out);
      source = out;
      bf16_at += t.layout.num_elems();
    }
    auto it = read.versions.find(t.spec.name());
    const std::vector<uint64_t>* versions =
        it == read.versions.end() ? nullptr : &it->second;
    // Runs of neighbouring slices bound for the same shard travel as one
    // piece of the caller's memory.
    const char* run_begin = nullptr;
    size_t run_bytes = 0;
    int run_home = -1;
    auto flush = [&] {
      if (run_bytes == 0) return;
      (*payloads)[run_home].emplace_back(const_cast<char*>(run_begin),
                                         run_bytes, &Borrowed::Release,
                                         borrowed);
      ++handed_over;
      run_bytes = 0;
    };
    for (uint32_t i = 0; i < t.layout.num_slices(); ++i) {
      const int home = map.ServingPosition(t.home[i]);
      SliceGradient* g = (*headers)[home].add_grads();
      g->set_tensor(t.spec.name());
      g->set_slice(i);
      g->set_read_version(
          versions != nullptr && i < versions->size() ? (*versions)[i] : 0);
      const size_t bytes =
          static_cast<size_t>(t.layout.SliceSize(i)) * WireBytes(dtype);
      g->set_grad_bytes(bytes);
      const char* begin = source + t.layout.SliceBegin(i) * WireBytes(dtype);
      if (home == run_home && run_begin + run_bytes == begin) {
        run_bytes += bytes;
      } else {
        flush();
        run_begin = begin;
        run_bytes = bytes;
        run_home = home;
      }
    }
    flush();
  }
  return handed_over;
}

void PsClient::AddRowPayloads(
    const std::vector<RowsSend>& tables, const ReadSet& read, WireDtype dtype,
    const ShardMap& map, std::vector<PushRequest>* headers,
    std::vector<std::vector<grpc::Slice>>* payloads) const {
  const size_t n = map.serving_shards().size();
  for (const RowsSend& send : tables) {
    const RowsGrad& g = *send.grad;
    const size_t dim = static_cast<size_t>(send.table->spec.dim());
    // Each distinct id to its home shard's position.
    std::vector<std::vector<uint32_t>> on(n);
    for (uint32_t u = 0; u < send.first.size(); ++u) {
      const int home = map.RowHome(send.table->key, g.ids[send.first[u]]);
      on[map.ServingPosition(home)].push_back(u);
    }
    auto read_table = read.tables.find(g.table);
    const ReadSet::Table* versions =
        read_table == read.tables.end() ? nullptr : read_table->second.get();
    const size_t row_bytes = dim * WireBytes(dtype);
    for (size_t s = 0; s < n; ++s) {
      if (on[s].empty()) continue;
      RowsGradient* out = (*headers)[s].add_rows();
      out->set_table(g.table);
      grpc::Slice payload(on[s].size() * row_bytes);
      char* dst =
          reinterpret_cast<char*>(const_cast<uint8_t*>(payload.begin()));
      for (uint32_t u : on[s]) {
        const uint64_t id = g.ids[send.first[u]];
        out->add_ids(id);
        uint64_t version = 0;
        if (versions != nullptr) {
          auto at = versions->index.find(id);
          if (at != versions->index.end()) {
            version = versions->versions[at->second];
          }
        }
        out->add_read_versions(version);
        const float* row = send.sums.data() + u * dim;
        if (dtype == WIRE_BF16) {
          EncodeBf16(row, dim, dst);
        } else {
          std::memcpy(dst, row, row_bytes);
        }
        dst += row_bytes;
      }
      out->set_grad_bytes(on[s].size() * row_bytes);
      (*payloads)[s].push_back(std::move(payload));
    }
  }
}

std::unique_ptr<PsClient::PendingPush> PsClient::StartSend(
    bool assign, int64_t clock, const PushSet& what, const ReadSet& read,
    std::shared_ptr<StepPairing> pairing) {
  std::unique_ptr<PendingPush> p(new PendingPush());
  const SendKind k = KindOf(assign);
  std::vector<const TensorState*> states;
  std::vector<RowsSend> tables;
  ShardMap map;
  absl::Status checked = CheckNotReader(k.what);
  // Tensors placed by one map, and that map's epoch sent.
  for (int tries = 0; checked.ok(); ++tries) {
    map = this->map();
    states.clear();
    checked = CheckTensorSend(assign, what, map, &states);
    if (!absl::IsAborted(checked) || tries == kMaxMapChanges) break;
  }
  if (checked.ok()) checked = CheckRowsSend(assign, what, &tables);
  if (!checked.ok()) {
    p->call_.Fail(checked);
    return p;
  }

  // Every shard that owns a slot gets a request, so that each sees the
  // clock; the sequence number is shared by all of them and by their
  // retries. Headers and payloads by position in `serving`.
  const std::vector<int>& serving = map.serving_shards();
  const uint64_t seq = next_seq_++;
  // Values are assigned exactly as given, whatever the gradients' wire type.
  const WireDtype dtype = assign ? WIRE_F32 : options_.push_dtype;
  std::vector<PushRequest> headers =
      PushHeaders(clock, seq, map.epoch(), serving, read.epochs);
  for (PushRequest& header : headers) {
    header.set_wire_dtype(dtype);
    header.set_assign(assign);
  }
  // A shard reads the slices' payloads first, then the rows'.
  std::vector<std::vector<grpc::Slice>> payloads(serving.size());
  p->borrowed_ = std::make_shared<Borrowed>();
  const int64_t handed_over = AddTensorPayloads(what, states, read, dtype, map,
                                                p.get(), &headers, &payloads);
  {
    absl::MutexLock l(&p->borrowed_->mu);
    p->borrowed_->refs = handed_over;
  }
  AddRowPayloads(tables, read, dtype, map, &headers, &payloads);

  const uint32_t connection = next_connection_++;
  std::vector<FanOut::Call> calls;
  for (size_t i = 0; i < serving.size(); ++i) {
    auto ps = std::make_unique<PushShard>();
    ps->shard = serving[i];
    ps->header = std::move(headers[i]);
    ps->payload = std::move(payloads[i]);
    // A step's part goes with its pull first: its own frame is made only
    // when it is sent alone (FrameOf).
    if (pairing == nullptr) ps->frame = MakeFrame(ps->header, ps->payload);
    ps->pairing = pairing;
    calls.push_back(PushCall(ps.get(), connection));
    p->shards_.push_back(std::move(ps));
  }
  // The parts hold the only references to the payload slices now.
  payloads.clear();
  auto fanout = std::make_unique<FanOut>(Env(), k.what, CallPolicy());
  fanout->Start(std::move(calls));
  p->reap_ = [this] { ReapFinishedStreams(); };
  p->queue_ = &queue_;
  PendingPush* raw_call = p.get();
  p->call_.Start(std::move(fanout),
                 [this, raw_call, method = k.what](absl::Status s) {
                   return raw_call->Finish(ResendRefused(raw_call, s, method));
                 });
  return p;
}

const grpc::ByteBuffer& PsClient::FrameOf(PushShard* ps) {
  if (!ps->frame.Valid()) ps->frame = MakeFrame(ps->header, ps->payload);
  return ps->frame;
}

FanOut::Call PsClient::PushCall(PushShard* ps, uint32_t connection) {
  const uint64_t id = ps->header.request_id();
  return StreamCall(
      ps->shard, /*push=*/true, connection, &ps->stream,
      [this, ps, id](DataStream* stream, FanOut::Done done) {
        // Routed by a map in which the shard has no slot any more: a part
        // not sent yet goes by the newer map; one sent before (this is a
        // retry: its answer was lost) goes there naming this shard, whose
        // applied seqs the new owners hold from the moves.
        std::optional<ShardMapProto> newer =
            StaleRoute(ps->shard, ps->header.map_epoch());
        if (newer.has_value()) {
          (ps->sent ? ps->moved : ps->refused) = *std::move(newer);
          return done(absl::OkStatus());
        }
        if (ps->sent) AskForNewerMap(ps->shard);
        ps->sent = true;
        StreamDone answered = [this, ps, done = std::move(done)](
                                  absl::Status st, grpc::ByteBuffer* answer) {
          if (st.ok()) st = ReadPushAnswer(*answer, &ps->response);
          // Routed with an older map: applied nowhere, done here; sent
          // again by the shard's map.
          std::optional<ShardMapProto> newer = RefusalMap(st);
          if (newer.has_value()) {
            LearnMap(*newer);
            ps->refused = *std::move(newer);
            ps->response.Clear();
            st = absl::OkStatus();
          } else if (!st.ok()) {
            HandMapIfBehind(ps->shard, st);
          }
          done(st);
        };
        std::shared_ptr<StepPairing> pairing = std::move(ps->pairing);
        if (pairing != nullptr &&
            pairing->Hold(ps->shard, ps, stream, &answered)) {
          return;
        }
        stream->Send(id, FrameOf(ps), std::move(answered));
      });
}

struct PsClient::Resend {
  std::vector<ShardMapProto> maps;
  // By the origins (shard, seq) the pieces name: a refused part keeps its
  // own (it was applied nowhere), a moved part adds itself to them.
  std::map<std::vector<std::pair<uint32_t, uint64_t>>, std::vector<PushPart>>
      groups;
};

absl::StatusOr<PsClient::Resend> PsClient::TakeResends(PendingPush* p) {
  Resend out;
  for (auto& ps : p->shards_) {
    const bool moved = ps->moved.has_value();
    if (!ps->refused.has_value() && !moved) continue;
    out.maps.push_back(moved ? *ps->moved : *ps->refused);
    PushPart part{ps->shard, ps->header, std::move(ps->payload)};
    if (moved) {
      PushOrigin* origin = part.header.add_moved_from();
      origin->set_shard(static_cast<uint32_t>(ps->shard));
      origin->set_seq(ps->header.seq());
    }
    if (part.header.moved_from_size() > kMaxPushOrigins) {
      return absl::AbortedError(absl::StrCat(
          "a push part went to ", part.header.moved_from_size(),
          " shards that were drained before it could be answered"));
    }
    std::vector<std::pair<uint32_t, uint64_t>> key;
    for (const PushOrigin& o : part.header.moved_from()) {
      key.emplace_back(o.shard(), o.seq());
    }
    out.groups[key].push_back(std::move(part));
    ps->refused.reset();
    ps->moved.reset();
    ps->frame.Clear();
    ps->payload.clear();
  }
  return out;
}

absl::Status PsClient::SendAgain(PendingPush* p, Resend resend,
                                 const ShardMap& map, const char* method) {
  const uint32_t connection = next_connection_++;
  std::vector<FanOut::Call> calls;
  for (auto& [origins, parts] : resend.groups) {
    absl::StatusOr<std::vector<PushPart>> split = SplitPushParts(parts, map);
    if (!split.ok()) return absl::InternalError(split.status().message());
    parts.clear();
    // A fresh seq: the refused shards gave theirs back, but the shards that
    // applied their part of it would take a piece under it as a duplicate.
    const uint64_t seq = next_seq_++;
    for (PushPart& part : *split) {
      auto ps = std::make_unique<PushShard>();
      ps->shard = part.shard;
      ps->header = std::move(part.header);
      ps->header.set_seq(seq);
      ps->header.set_request_id(next_request_id_++);
      ps->header.set_map_epoch(map.epoch());
      ps->payload = std::move(part.payload);
      ps->frame = MakeFrame(ps->header, ps->payload);
      calls.push_back(PushCall(ps.get(), connection));
      p->shards_.push_back(std::move(ps));
    }
  }
  FanOut again(Env(), method, CallPolicy());
  again.Start(std::move(calls));
  return again.Wait();
}

absl::Status PsClient::ResendRefused(PendingPush* p, absl::Status s,
                                     const char* method) {
  for (int changes = 0; s.ok(); ++changes) {
    absl::StatusOr<Resend> resend = TakeResends(p);
    if (!resend.ok()) return resend.status();
    if (resend->groups.empty()) return s;
    if (changes == kMaxMapChanges) {
      return absl::AbortedError(absl::StrCat(
          method, ": the shard map changed ", changes,
          " times while the call ran (now epoch ", resend->maps[0].epoch(),
          "); giving up with the parts of ", resend->maps.size(),
          " shard(s) applied nowhere"));
    }
    for (const ShardMapProto& wire : resend->maps) {
      absl::StatusOr<ShardMap> m = ShardMapFromProto(wire);
      if (!m.ok()) return absl::InternalError(m.status().message());
      if (s = FollowMap(*m); !s.ok()) return s;
    }
    s = SendAgain(p, *std::move(resend), this->map(), method);
  }
  return s;
}

absl::StatusOr<PushSummary> PsClient::Push(
    int64_t clock,
    const std::vector<std::pair<std::string, const float*>>& grads) {
  return StartPush(clock, grads, LastRead())->Wait();
}

ReadSet PsClient::LastRead() const {
  absl::MutexLock l(&mu_);
  return last_read_;
}

std::vector<PushRequest> PsClient::PushHeaders(
    int64_t clock, uint64_t seq, uint64_t map_epoch,
    const std::vector<int>& shards,
    const absl::flat_hash_map<int, uint64_t>& epochs) {
  std::vector<PushRequest> headers(shards.size());
  for (size_t i = 0; i < shards.size(); ++i) {
    PushRequest& h = headers[i];
    *h.mutable_worker() = MakeWorkerRef(clock);
    h.set_seq(seq);
    h.set_request_id(next_request_id_++);
    h.set_wire_dtype(options_.push_dtype);
    h.set_map_epoch(map_epoch);
    auto read = epochs.find(shards[i]);
    if (read != epochs.end()) h.set_read_epoch(read->second);
  }
  return headers;
}

absl::Status ReadPushAnswer(const grpc::ByteBuffer& answer,
                            PushResponse* response) {
  response->Clear();
  absl::Status st = ParseFromByteBuffer(answer, response);
  if (!st.ok()) return absl::InternalError(st.message());
  return FromCallStatus(response->status());
}

}  // namespace asyncps
