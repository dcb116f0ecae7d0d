// PsClient's pulls: one request per shard for a step's tensors and rows,
// on the data streams, and the answers copied into the caller's buffers.
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/ps_client.h"
#include "client/ps_client_internal.h"
#include "common/fast_frame.h"
#include "common/names.h"
#include "common/payload.h"
#include "common/shard_map_proto.h"

namespace asyncps {

// One table of a pull: its ids de-duplicated. The answers of several
// shards fill it at once, each its own rows.
struct PsClient::RowsQueryState {
  std::string name;
  int dim = 0;
  absl::Span<const uint64_t> ids;
  float* out = nullptr;
  std::vector<uint32_t> unique_of;  // per position: its distinct id's index
  std::vector<uint32_t> first;      // per distinct id: its first position
  std::shared_ptr<ReadSet::Table> read;  // id -> index, and versions
};

namespace {

// The distinct ids of `ids`: index[id] numbers them in order of first
// appearance; unique_of[i] is that number for position i, first[u] the
// first position of distinct id u.
void Distinct(absl::Span<const uint64_t> ids,
              absl::flat_hash_map<uint64_t, uint32_t>* index,
              std::vector<uint32_t>* unique_of, std::vector<uint32_t>* first) {
  index->reserve(ids.size());
  unique_of->resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto [it, fresh] =
        index->try_emplace(ids[i], static_cast<uint32_t>(index->size()));
    if (fresh) first->push_back(static_cast<uint32_t>(i));
    (*unique_of)[i] = it->second;
  }
}

}  // namespace

uint64_t ReadSet::VersionOf(const std::string& table, uint64_t id) const {
  auto it = tables.find(table);
  if (it == tables.end()) return 0;
  auto at = it->second->index.find(id);
  return at == it->second->index.end() ? 0 : it->second->versions[at->second];
}

void ReadSet::Update(const ReadSet& newer) {
  for (const auto& [name, v] : newer.versions) versions[name] = v;
  for (const auto& [name, t] : newer.tables) tables[name] = t;
  for (const auto& [shard, epoch] : newer.epochs) {
    if (epoch != 0) epochs[shard] = epoch;
  }
}

PsClient::PendingPull::PendingPull() = default;

PsClient::PendingPull::~PendingPull() = default;

absl::Status PsClient::PendingPull::Finish(absl::Status s) {
  if (!s.ok()) return s;
  for (const auto& ps : shards_) {
    read_.epochs[ps->shard] = ps->epoch;
    rows_created_ += ps->rows_created;
    for (const auto& [name, list] : ps->versions) {
      std::vector<uint64_t>& v = read_.versions[name];
      for (const auto& [slice, version] : list) v[slice] = version;
    }
  }
  for (const auto& q : queries_) {
    // Repeated ids get the row their first position received.
    const size_t row = static_cast<size_t>(q->dim);
    for (size_t i = 0; i < q->ids.size(); ++i) {
      const uint32_t from = q->first[q->unique_of[i]];
      if (from != i) {
        std::memcpy(q->out + i * row, q->out + from * row, row * sizeof(float));
      }
    }
    read_.tables[q->name] = q->read;
  }
  return s;
}

namespace {

// The part for shard s, made when first needed: parts[i] is that of the
// shard at position i of map.serving_shards() (a shard that owns a slot).
template <typename Part>
Part& PartOf(std::vector<std::unique_ptr<Part>>* parts, const ShardMap& map,
             int s) {
  std::unique_ptr<Part>& part = (*parts)[map.ServingPosition(s)];
  if (part == nullptr) {
    part = std::make_unique<Part>();
    part->shard = s;
  }
  return *part;
}

}  // namespace

absl::Status PsClient::PlanTensorPull(
    const std::vector<std::pair<std::string, float*>>& outs,
    const ShardMap& map, PendingPull* p,
    std::vector<std::unique_ptr<PullShard>>* shards) const {
  absl::flat_hash_map<std::string, std::pair<const TensorState*, float*>>
      wanted;
  for (const auto& [name, buffer] : outs) {
    const TensorState* t = FindTensor(name);
    if (t == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("Pull: unknown tensor ", QuoteName(name),
                       " (create it or wait for it before pulling)"));
    }
    if (buffer == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("Pull: null buffer for tensor ", QuoteName(name)));
    }
    if (t->map_epoch != map.epoch()) {
      return absl::AbortedError("the map changed while the pull was planned");
    }
    if (!wanted.try_emplace(name, t, buffer).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("Pull: tensor ", QuoteName(name), " requested twice"));
    }
    p->read_.versions[name].assign(t->layout.num_slices(), 0);
  }
  std::vector<const std::pair<const TensorState*, float*>*> targets;
  targets.reserve(outs.size());
  for (const auto& out : outs) targets.push_back(&wanted.at(out.first));
  for (const int s : map.serving_shards()) {
    for (size_t k = 0; k < outs.size(); ++k) {
      const auto& target = *targets[k];
      if (target.first->slices_on[s] == 0) continue;
      PullShard& ps = PartOf(shards, map, s);
      ps.request.add_tensors(outs[k].first);
      ps.targets.emplace(outs[k].first, target);
      ps.slices += target.first->slices_on[s];
    }
  }
  return absl::OkStatus();
}

absl::Status PsClient::PlanRowsPull(
    const std::vector<RowsQuery>& queries, const ShardMap& map, PendingPull* p,
    std::vector<std::unique_ptr<PullShard>>* shards) const {
  const size_t n = map.serving_shards().size();
  for (const RowsQuery& query : queries) {
    const TableState* t = FindTable(query.table);
    if (t == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("Pull: unknown table ", QuoteName(query.table),
                       " (create it or wait for it before pulling)"));
    }
    if (query.out == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("Pull: null buffer for table ", QuoteName(query.table)));
    }
    if (options_.reader && !query.peek) {
      return absl::InvalidArgumentError(
          absl::StrCat("Pull: a reader creates no rows; peek at table ",
                       QuoteName(query.table)));
    }
    for (const auto& q : p->queries_) {
      if (q->name == query.table) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Pull: table ", QuoteName(query.table), " requested twice"));
      }
    }
    auto q = std::make_unique<RowsQueryState>();
    q->name = query.table;
    q->dim = t->spec.dim();
    q->ids = query.ids;
    q->out = query.out;
    q->read = std::make_shared<ReadSet::Table>();
    Distinct(query.ids, &q->read->index, &q->unique_of, &q->first);
    q->read->versions.assign(q->first.size(), 0);
    // Each distinct id to its home shard, in order of first appearance.
    // This table's entry in each request, by the shard's serving position.
    std::vector<int> entry(n, -1);
    for (uint32_t u = 0; u < q->first.size(); ++u) {
      const uint64_t id = query.ids[q->first[u]];
      const int home = map.RowHome(t->key, id);
      PullShard& ps = PartOf(shards, map, home);
      int& at = entry[map.ServingPosition(home)];
      if (at < 0) {
        at = ps.request.rows_size();
        TableIds* rows = ps.request.add_rows();
        rows->set_table(query.table);
        rows->set_peek(query.peek);
        ps.queries.push_back(q.get());
        ps.uniques.emplace_back();
      }
      ps.request.mutable_rows(at)->add_ids(id);
      ps.uniques[at].push_back(u);
    }
    p->queries_.push_back(std::move(q));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<FanOut::Call>> PsClient::PlanPull(PendingPull* p) {
  for (auto& ps : p->shards_) {
    // Rows an earlier plan's answers created count (pulled again, they
    // exist).
    if (!ps->refused.has_value()) p->rows_created_ += ps->rows_created;
    p->earlier_shards_.push_back(std::move(ps));
  }
  p->shards_.clear();
  std::vector<std::unique_ptr<PullShard>> shards;
  ShardMap map;
  absl::Status planned;
  // Tensors and rows placed by one map, and that map's epoch sent.
  for (int tries = 0;; ++tries) {
    for (auto& q : p->queries_) p->earlier_queries_.push_back(std::move(q));
    p->queries_.clear();
    map = this->map();
    shards.clear();
    shards.resize(map.serving_shards().size());
    planned = PlanTensorPull(p->what_.tensors, map, p, &shards);
    if (planned.ok()) planned = PlanRowsPull(p->what_.rows, map, p, &shards);
    if (!absl::IsAborted(planned) || tries == kMaxMapChanges) break;
  }
  if (!planned.ok()) return planned;

  const uint32_t connection = next_connection_++;
  std::vector<FanOut::Call> calls;
  for (auto& ps : shards) {
    if (ps == nullptr) continue;  // owns nothing asked
    SetPullCaller(p->clock_, p->for_clock_, &ps->request);
    ps->request.set_map_epoch(map.epoch());
    ps->request.set_wire_dtype(options_.pull_dtype);
    ps->pairing = p->pairing_;
    PullShard* raw = ps.get();
    calls.push_back(StreamCall(
        raw->shard, /*push=*/false, connection, &raw->stream,
        [this, raw, connection](DataStream* stream, FanOut::Done done) {
          std::shared_ptr<StepPairing> pairing = std::move(raw->pairing);
          std::optional<ShardMapProto> newer =
              StaleRoute(raw->shard, raw->request.map_epoch());
          if (newer.has_value()) {
            raw->refused = *std::move(newer);
            return done(absl::OkStatus());
          }
          if (raw->tried) AskForNewerMap(raw->shard);
          raw->tried = true;
          const uint64_t id = next_request_id_++;
          raw->request.set_request_id(id);
          StreamDone answered = [this, raw, done = std::move(done)](
                                    absl::Status st, grpc::ByteBuffer* answer) {
            if (st.ok()) st = ReadPull(*answer, raw);
            done(st);
          };
          if (pairing != nullptr &&
              SendStep(pairing.get(), raw, connection, &answered)) {
            return;
          }
          stream->Send(id, SerializeToByteBuffer(raw->request),
                       std::move(answered));
        }));
    p->shards_.push_back(std::move(ps));
  }
  p->pairing_.reset();  // only the first plan pairs
  return calls;
}

absl::Status PsClient::RepullRefused(PendingPull* p, absl::Status s) {
  for (int changes = 0; s.ok(); ++changes) {
    std::vector<ShardMapProto> refused;
    for (const auto& ps : p->shards_) {
      if (ps->refused.has_value()) refused.push_back(*ps->refused);
    }
    if (refused.empty()) return s;
    if (changes == kMaxMapChanges) {
      return absl::UnavailableError(
          absl::StrCat("Pull: the shard map changed ", changes,
                       " times while the pull ran (now epoch ",
                       refused[0].epoch(), "); giving up"));
    }
    for (const ShardMapProto& wire : refused) {
      absl::StatusOr<ShardMap> m = ShardMapFromProto(wire);
      if (!m.ok()) return absl::InternalError(m.status().message());
      if (s = FollowMap(*m); !s.ok()) return s;
    }
    absl::StatusOr<std::vector<FanOut::Call>> calls = PlanPull(p);
    if (!calls.ok()) return calls.status();
    if (calls->empty()) return absl::OkStatus();
    FanOut again(Env(), "Pull", WaitPolicy());
    again.Start(*std::move(calls));
    s = again.Wait();
  }
  return s;
}

std::unique_ptr<PsClient::PendingPull> PsClient::StartPull(
    int64_t clock, int64_t for_clock, const PullSet& what) {
  return StartPullPaired(clock, for_clock, what, nullptr);
}

std::unique_ptr<PsClient::PendingPull> PsClient::StartPullPaired(
    int64_t clock, int64_t for_clock, const PullSet& what,
    std::shared_ptr<StepPairing> pairing) {
  std::unique_ptr<PendingPull> p(new PendingPull());
  p->pairing_ = std::move(pairing);
  p->what_ = what;
  p->clock_ = clock;
  p->for_clock_ = for_clock;
  if (for_clock < clock) {
    p->call_.Fail(absl::InvalidArgumentError(absl::StrCat(
        "Pull: for_clock ", for_clock, " is behind the clock ", clock)));
    return p;
  }
  absl::StatusOr<std::vector<FanOut::Call>> calls = PlanPull(p.get());
  if (!calls.ok()) {
    p->call_.Fail(calls.status());
    return p;
  }
  std::unique_ptr<FanOut> fanout;  // none: nothing to pull
  if (!calls->empty()) {
    fanout = std::make_unique<FanOut>(Env(), "Pull", WaitPolicy());
    fanout->Start(*std::move(calls));
  }
  PendingPull* raw_pull = p.get();
  p->call_.Start(std::move(fanout), [this, raw_pull](absl::Status s) {
    return raw_pull->Finish(RepullRefused(raw_pull, s));
  });
  return p;
}

// Copies the slices of one answer into the caller's buffers; records each
// slice's version.
absl::Status PsClient::ReadSlices(const PullResponse& header,
                                  FrameReader* frame, PullShard* ps) {
  const WireDtype dtype = header.wire_dtype();
  ps->versions.clear();
  absl::flat_hash_map<std::string, std::vector<bool>> seen;
  uint32_t received = 0;
  for (const SliceData& d : header.slices()) {
    auto it = ps->targets.find(d.tensor());
    if (it == ps->targets.end()) {
      return absl::InternalError(absl::StrCat("returned a slice of tensor ",
                                              QuoteName(d.tensor()),
                                              ", which was not requested"));
    }
    const TensorState& t = *it->second.first;
    if (d.slice() >= t.layout.num_slices() || t.home[d.slice()] != ps->shard) {
      return absl::InternalError(absl::StrCat(
          "returned slice ", d.slice(), " of tensor ", QuoteName(d.tensor()),
          ", which is not one of its ", t.layout.num_slices(),
          " slices homed there (are the shards listed in the order of "
          "their --shard_index?)"));
    }
    std::vector<bool>& got = seen[d.tensor()];
    got.resize(t.layout.num_slices(), false);
    if (got[d.slice()]) {
      return absl::InternalError(absl::StrCat("returned slice ", d.slice(),
                                              " of tensor ",
                                              QuoteName(d.tensor()), " twice"));
    }
    const int64_t elems = t.layout.SliceSize(d.slice());
    const uint64_t bytes = static_cast<uint64_t>(elems) * WireBytes(dtype);
    if (d.payload_bytes() != bytes) {
      return absl::InternalError(absl::StrCat(
          "returned ", d.payload_bytes(), " bytes for slice ", d.slice(),
          " of tensor ", QuoteName(d.tensor()), ", expected ", bytes));
    }
    float* dst = it->second.second + t.layout.SliceBegin(d.slice());
    absl::Status st = frame->DecodeNext(bytes, dtype, dst);
    if (!st.ok()) return absl::InternalError(st.message());
    got[d.slice()] = true;
    ps->versions[d.tensor()].emplace_back(d.slice(), d.version());
    ++received;
  }
  if (received != ps->slices) {
    return absl::InternalError(
        absl::StrCat("returned ", received, " slices, expected ", ps->slices));
  }
  return absl::OkStatus();
}

// Copies the rows of one answer to the first position of each distinct id;
// records each row's version.
absl::Status PsClient::ReadRows(const PullResponse& header, FrameReader* frame,
                                PullShard* ps) {
  const WireDtype dtype = header.wire_dtype();
  ps->rows_created = 0;
  if (header.rows_size() != ps->request.rows_size()) {
    return absl::InternalError(absl::StrCat("answered ", header.rows_size(),
                                            " tables of rows to a request for ",
                                            ps->request.rows_size()));
  }
  for (int k = 0; k < header.rows_size(); ++k) {
    const RowsData& d = header.rows(k);
    const TableIds& asked = ps->request.rows(k);
    RowsQueryState& q = *ps->queries[k];
    const size_t row_bytes = static_cast<size_t>(q.dim) * WireBytes(dtype);
    if (d.table() != asked.table() || d.versions_size() != asked.ids_size() ||
        d.payload_bytes() != row_bytes * asked.ids_size()) {
      return absl::InternalError(absl::StrCat(
          "answered ", d.versions_size(), " rows (", d.payload_bytes(),
          " bytes) of table ", QuoteName(d.table()), " for ", asked.ids_size(),
          " rows of table ", QuoteName(asked.table()), " of dim ", q.dim));
    }
    const std::vector<uint32_t>& uniques = ps->uniques[k];
    for (int i = 0; i < asked.ids_size(); ++i) {
      const uint32_t u = uniques[i];
      absl::Status st = frame->DecodeNext(
          row_bytes, dtype, q.out + static_cast<size_t>(q.first[u]) * q.dim);
      if (!st.ok()) return absl::InternalError(st.message());
      q.read->versions[u] = d.versions(i);
    }
    ps->rows_created += d.rows_created();
  }
  return absl::OkStatus();
}

absl::Status PsClient::ReadPull(const grpc::ByteBuffer& answer, PullShard* ps) {
  PullResponse header;
  FrameReader frame;
  absl::Status st = frame.Open(answer, &header);
  if (!st.ok()) return absl::InternalError(st.message());
  st = FromCallStatus(header.status());
  if (!st.ok()) {
    // Routed with an older map: done here, pulled again by the shard's.
    std::optional<ShardMapProto> newer = RefusalMap(st);
    if (!newer.has_value()) {
      HandMapIfBehind(ps->shard, st);
      return st;
    }
    LearnMap(*newer);
    ps->refused = *std::move(newer);
    return absl::OkStatus();
  }
  NoteEpoch(ps->shard, header.shard_epoch());
  const WireDtype dtype = header.wire_dtype();
  if (dtype != WIRE_F32 && dtype != WIRE_BF16) {
    return absl::InternalError(
        absl::StrCat("answered in unknown wire_dtype ", dtype));
  }
  // The slices come first in the payload, then the rows.
  st = ReadSlices(header, &frame, ps);
  if (st.ok()) st = ReadRows(header, &frame, ps);
  if (!st.ok()) return st;
  if (frame.remaining() != 0) {
    return absl::InternalError(absl::StrCat(
        "returned ", frame.remaining(), " bytes beyond its slices and rows"));
  }
  ps->epoch = header.shard_epoch();
  return absl::OkStatus();
}

absl::Status PsClient::Pull(
    int64_t clock, const std::vector<std::pair<std::string, float*>>& outs) {
  std::unique_ptr<PendingPull> p = StartPull(clock, clock, outs);
  absl::Status s = p->Wait();
  if (!s.ok()) return s;
  absl::MutexLock l(&mu_);
  last_read_.Update(p->read_);
  return absl::OkStatus();
}

}  // namespace asyncps
