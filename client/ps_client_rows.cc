// PsClient's sparse tables: creation, and pulls and pushes of rows routed
// to their home shards (common::RowHome) on the data streams.
#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <cstring>
#include <functional>

#include "absl/strings/str_cat.h"
#include "client/ps_client.h"
#include "client/ps_client_internal.h"
#include "common/fast_frame.h"
#include "common/grpc_status.h"
#include "common/names.h"
#include "common/payload.h"
#include "common/sharding.h"

namespace asyncps {

uint64_t ReadSet::VersionOf(const std::string& table, uint64_t id) const {
  auto it = tables.find(table);
  if (it == tables.end()) return 0;
  auto at = it->second->index.find(id);
  return at == it->second->index.end() ? 0 : it->second->versions[at->second];
}

// One table of a rows pull: its ids de-duplicated. The answers of several
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

// One shard's part of a rows pull.
struct PsClient::RowsPullShard {
  int shard = 0;
  PullRequest request;
  // Per entry k of request.rows: its query, and the distinct-id index of
  // each of its ids.
  std::vector<RowsQueryState*> queries;
  std::vector<std::vector<uint32_t>> uniques;
  uint64_t epoch = 0;  // of the last successful answer
};

namespace {

// The distinct ids of `ids`: index[id] numbers them in order of first
// appearance; unique_of[i] is that number for position i.
void Distinct(absl::Span<const uint64_t> ids,
              absl::flat_hash_map<uint64_t, uint32_t>* index,
              std::vector<uint32_t>* unique_of,
              std::vector<uint32_t>* first = nullptr) {
  index->reserve(ids.size());
  unique_of->resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto [it, fresh] =
        index->try_emplace(ids[i], static_cast<uint32_t>(index->size()));
    if (fresh && first != nullptr) first->push_back(static_cast<uint32_t>(i));
    (*unique_of)[i] = it->second;
  }
}

// A retried stream request: sends `frame` (or a serialized request) on
// `stream` and hands the answer to `read`.
FanOut::Call StreamCall(
    int shard, DataStream* stream, std::function<grpc::ByteBuffer()> request,
    std::function<uint64_t()> id,
    std::function<absl::Status(const grpc::ByteBuffer&)> read) {
  FanOut::Call call;
  call.shard = shard;
  call.start = [stream, request = std::move(request), id = std::move(id),
                read = std::move(read)](grpc::ClientContext*,
                                        FanOut::Done done) {
    stream->Send(id(), request(),
                 [read, done = std::move(done)](absl::Status st,
                                                grpc::ByteBuffer* answer) {
                   if (st.ok()) st = read(*answer);
                   done(st);
                 });
  };
  call.cancel = [stream] { stream->Cancel(); };
  return call;
}

}  // namespace

// ---------------------------------------------------------------- tables

absl::Status PsClient::RememberTable(const TableSpec& spec) {
  auto state =
      std::make_unique<TableState>(TableState{spec, RowTableKey(spec.name())});
  absl::MutexLock l(&mu_);
  return RememberOnce(&row_tables_, std::move(state), "table");
}

const PsClient::TableState* PsClient::FindTable(const std::string& name) const {
  absl::MutexLock l(&mu_);
  auto it = row_tables_.find(name);
  return it == row_tables_.end() ? nullptr : it->second.get();
}

const TableSpec* PsClient::FindTableSpec(const std::string& name) const {
  const TableState* t = FindTable(name);
  return t == nullptr ? nullptr : &t->spec;
}

absl::Status PsClient::CreateTables(const std::vector<TableSpec>& specs) {
  if (specs.empty()) return absl::OkStatus();
  CreateTensorRequest request;
  for (const TableSpec& spec : specs) *request.add_tables() = spec;
  std::vector<CreateTensorResponse> responses;
  absl::Status status = ToAllShards(
      "CreateTensor", request, &responses, IssueCreateTensor,
      [&request, &responses](int s) -> absl::Status {
        // Every shard stores the specs as given.
        const auto& got = responses[s].tables();
        if (got.size() != request.tables_size() ||
            !std::equal(
                got.begin(), got.end(), request.tables().begin(),
                [](const TableSpec& a, const TableSpec& b) {
                  return google::protobuf::util::MessageDifferencer::Equals(a,
                                                                            b);
                })) {
          return absl::InternalError(
              "answered other table specs than the ones requested");
        }
        return absl::OkStatus();
      },
      CallPolicy());
  if (!status.ok()) return status;
  for (const TableSpec& spec : specs) {
    absl::Status s = RememberTable(spec);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- pull

PsClient::PendingRowsPull::PendingRowsPull() = default;

PsClient::PendingRowsPull::~PendingRowsPull() = default;

absl::Status PsClient::PendingRowsPull::Finish(absl::Status s) {
  if (!s.ok()) return s;
  for (const auto& ps : shards_) read_.epochs[ps->shard] = ps->epoch;
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

std::unique_ptr<PsClient::PendingRowsPull> PsClient::StartPullRows(
    int64_t clock, int64_t for_clock, const std::vector<RowsQuery>& queries) {
  std::unique_ptr<PendingRowsPull> p(new PendingRowsPull());
  const int n = num_shards();
  p->read_.epochs.assign(n, 0);
  if (for_clock < clock) {
    p->call_.Fail(absl::InvalidArgumentError(absl::StrCat(
        "PullRows: for_clock ", for_clock, " is behind the clock ", clock)));
    return p;
  }
  std::vector<std::unique_ptr<RowsPullShard>> shards(n);
  for (const RowsQuery& query : queries) {
    const TableState* t = FindTable(query.table);
    if (t == nullptr) {
      p->call_.Fail(absl::NotFoundError(
          absl::StrCat("PullRows: unknown table ", QuoteName(query.table),
                       " (create it or wait for it before pulling)")));
      return p;
    }
    if (query.out == nullptr) {
      p->call_.Fail(absl::InvalidArgumentError(absl::StrCat(
          "PullRows: null buffer for table ", QuoteName(query.table))));
      return p;
    }
    if (options_.reader && !query.peek) {
      p->call_.Fail(absl::InvalidArgumentError(
          absl::StrCat("PullRows: a reader creates no rows; peek at table ",
                       QuoteName(query.table))));
      return p;
    }
    for (const auto& q : p->queries_) {
      if (q->name == query.table) {
        p->call_.Fail(absl::InvalidArgumentError(absl::StrCat(
            "PullRows: table ", QuoteName(query.table), " requested twice")));
        return p;
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
    std::vector<int> entry(n,
                           -1);  // this table's entry in each shard's request
    for (uint32_t u = 0; u < q->first.size(); ++u) {
      const uint64_t id = query.ids[q->first[u]];
      const int home = RowHomeOf(t->key, id, n);
      if (shards[home] == nullptr) {
        shards[home] = std::make_unique<RowsPullShard>();
        shards[home]->shard = home;
      }
      RowsPullShard& ps = *shards[home];
      if (entry[home] < 0) {
        entry[home] = ps.request.rows_size();
        TableIds* rows = ps.request.add_rows();
        rows->set_table(query.table);
        rows->set_peek(query.peek);
        ps.queries.push_back(q.get());
        ps.uniques.emplace_back();
      }
      ps.request.mutable_rows(entry[home])->add_ids(id);
      ps.uniques[entry[home]].push_back(u);
    }
    p->queries_.push_back(std::move(q));
  }

  const uint32_t connection = next_connection_++;
  std::vector<FanOut::Call> calls;
  for (auto& ps : shards) {
    if (ps == nullptr) continue;
    SetPullCaller(clock, for_clock, &ps->request);
    ps->request.set_wire_dtype(options_.pull_dtype);
    RowsPullShard* raw = ps.get();
    Shard& shard = *shards_[raw->shard];
    calls.push_back(StreamCall(
        raw->shard, shard.pulls[connection % shard.pulls.size()].get(),
        [this, raw] {
          raw->request.set_request_id(next_request_id_++);
          return SerializeToByteBuffer(raw->request);
        },
        [raw] { return raw->request.request_id(); },
        [this, raw](const grpc::ByteBuffer& answer) {
          return ReadRowsPull(answer, raw);
        }));
    p->shards_.push_back(std::move(ps));
  }
  std::unique_ptr<FanOut> fanout;  // none: no rows to pull
  if (!calls.empty()) {
    fanout = std::make_unique<FanOut>(Env(), "PullRows", WaitPolicy());
    fanout->Start(std::move(calls));
  }
  PendingRowsPull* raw_call = p.get();
  p->call_.Start(std::move(fanout),
                 [raw_call](absl::Status s) { return raw_call->Finish(s); });
  return p;
}

absl::Status PsClient::ReadRowsPull(const grpc::ByteBuffer& answer,
                                    RowsPullShard* ps) {
  PullResponse header;
  FrameReader frame;
  absl::Status st = OpenPullAnswer(answer, ps->shard, &header, &frame);
  if (!st.ok()) return st;
  const WireDtype dtype = header.wire_dtype();
  if (header.slices_size() != 0 ||
      header.rows_size() != ps->request.rows_size()) {
    return absl::InternalError(
        absl::StrCat("answered ", header.rows_size(), " tables of rows and ",
                     header.slices_size(), " slices to a request for ",
                     ps->request.rows_size(), " tables of rows"));
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
      st = frame.DecodeNext(row_bytes, dtype,
                            q.out + static_cast<size_t>(q.first[u]) * q.dim);
      if (!st.ok()) return absl::InternalError(st.message());
      q.read->versions[u] = d.versions(i);
    }
  }
  if (frame.remaining() != 0) {
    return absl::InternalError(
        absl::StrCat("returned ", frame.remaining(), " bytes beyond its rows"));
  }
  ps->epoch = header.shard_epoch();
  return absl::OkStatus();
}

// ---------------------------------------------------------------- push

absl::StatusOr<PushSummary> PsClient::PendingRowsPush::Finish(absl::Status s) {
  frames_.clear();
  if (!s.ok()) return s;
  PushSummary summary;
  uint64_t staleness_sum = 0;
  for (const PushResponse& r : responses_) {
    if (r.duplicate()) ++summary.duplicates;
    for (const RowsResult& t : r.row_results()) {
      summary.applied += t.applied();
      summary.refused_stale += t.refused_stale();
      summary.refused_restored += t.refused_restored();
      summary.rows_created += t.rows_created();
      summary.max_staleness =
          std::max(summary.max_staleness, t.max_staleness());
      staleness_sum += t.staleness_sum();
    }
  }
  const int64_t counted = summary.applied + summary.refused_stale;
  if (counted > 0) {
    summary.mean_staleness =
        static_cast<double>(staleness_sum) / static_cast<double>(counted);
  }
  return summary;
}

std::unique_ptr<PsClient::PendingRowsPush> PsClient::StartPushRows(
    int64_t clock, const std::vector<RowsGrad>& grads, const ReadSet& read) {
  return StartSendRows(/*assign=*/false, clock, grads, read);
}

std::unique_ptr<PsClient::PendingRowsPush> PsClient::StartAssignRows(
    int64_t clock, const std::vector<RowsGrad>& values) {
  return StartSendRows(/*assign=*/true, clock, values, ReadSet());
}

std::unique_ptr<PsClient::PendingRowsPush> PsClient::StartSendRows(
    bool assign, int64_t clock, const std::vector<RowsGrad>& grads,
    const ReadSet& read) {
  std::unique_ptr<PendingRowsPush> p(new PendingRowsPush());
  const char* what = assign ? "AssignRows" : "PushRows";
  const char* payload = assign ? "values" : "gradient";
  if (absl::Status s = CheckNotReader(what); !s.ok()) {
    p->call_.Fail(s);
    return p;
  }
  const int n = num_shards();
  // Values are assigned exactly as given, whatever the gradients' wire type.
  const WireDtype dtype = assign ? WIRE_F32 : options_.push_dtype;
  // The sequence number is shared by every shard's push and their retries.
  std::vector<PushRequest> headers =
      PushHeaders(clock, next_seq_++, read.epochs);
  for (PushRequest& header : headers) {
    header.set_wire_dtype(dtype);
    header.set_assign(assign);
  }
  std::vector<std::vector<grpc::Slice>> payloads(n);
  std::vector<const TableState*> seen;
  for (const RowsGrad& g : grads) {
    const TableState* t = FindTable(g.table);
    if (t == nullptr) {
      p->call_.Fail(absl::NotFoundError(
          absl::StrCat(what, ": unknown table ", QuoteName(g.table),
                       " (create it or wait for it first)")));
      return p;
    }
    if (g.grads == nullptr) {
      p->call_.Fail(absl::InvalidArgumentError(absl::StrCat(
          what, ": null ", payload, " buffer for table ", QuoteName(g.table))));
      return p;
    }
    if (std::find(seen.begin(), seen.end(), t) != seen.end()) {
      p->call_.Fail(absl::InvalidArgumentError(
          absl::StrCat(what, ": table ", QuoteName(g.table), " given twice")));
      return p;
    }
    seen.push_back(t);
    if (g.ids.empty()) continue;
    // A shard would refuse it while the others apply theirs: refused here,
    // before anything is sent.
    if (!AllFinite(reinterpret_cast<const char*>(g.grads),
                   g.ids.size() * t->spec.dim(), WIRE_F32)) {
      p->call_.Fail(absl::InvalidArgumentError(absl::StrCat(
          what, ": the ", payload, " of table ", QuoteName(g.table),
          " contains NaN or Inf; nothing was sent")));
      return p;
    }
    // Sum the gradients of repeated ids (an assign has none).
    const size_t dim = static_cast<size_t>(t->spec.dim());
    absl::flat_hash_map<uint64_t, uint32_t> index;
    std::vector<uint32_t> unique_of;
    std::vector<uint32_t> first;
    Distinct(g.ids, &index, &unique_of, &first);
    if (assign && first.size() != g.ids.size()) {
      for (size_t i = 0; i < g.ids.size(); ++i) {
        if (first[unique_of[i]] != i) {
          p->call_.Fail(absl::InvalidArgumentError(absl::StrCat(
              what, ": row ", g.ids[i], " of table ", QuoteName(g.table),
              " given twice; nothing was sent")));
          return p;
        }
      }
    }
    std::vector<float> sums(first.size() * dim, 0.0f);
    for (size_t i = 0; i < g.ids.size(); ++i) {
      float* into = sums.data() + unique_of[i] * dim;
      const float* from = g.grads + i * dim;
      for (size_t d = 0; d < dim; ++d) into[d] += from[d];
    }
    // Each distinct id to its home shard.
    std::vector<std::vector<uint32_t>> on(n);
    for (uint32_t u = 0; u < first.size(); ++u) {
      on[RowHomeOf(t->key, g.ids[first[u]], n)].push_back(u);
    }
    auto read_table = read.tables.find(g.table);
    const ReadSet::Table* versions =
        read_table == read.tables.end() ? nullptr : read_table->second.get();
    for (int s = 0; s < n; ++s) {
      if (on[s].empty()) continue;
      RowsGradient* out = headers[s].add_rows();
      out->set_table(g.table);
      const size_t row_bytes = dim * WireBytes(dtype);
      grpc::Slice payload(on[s].size() * row_bytes);
      char* dst =
          reinterpret_cast<char*>(const_cast<uint8_t*>(payload.begin()));
      for (uint32_t u : on[s]) {
        const uint64_t id = g.ids[first[u]];
        out->add_ids(id);
        uint64_t version = 0;
        if (versions != nullptr) {
          auto at = versions->index.find(id);
          if (at != versions->index.end())
            version = versions->versions[at->second];
        }
        out->add_read_versions(version);
        const float* row = sums.data() + u * dim;
        if (dtype == WIRE_BF16) {
          EncodeBf16(row, dim, dst);
        } else {
          std::memcpy(dst, row, row_bytes);
        }
        dst += row_bytes;
      }
      out->set_grad_bytes(on[s].size() * row_bytes);
      payloads[s].push_back(std::move(payload));
    }
  }

  // Every shard gets a push, so that it sees the clock.
  const uint32_t connection = next_connection_++;
  p->frames_.resize(n);
  p->responses_.resize(n);
  std::vector<FanOut::Call> calls;
  for (int s = 0; s < n; ++s) {
    const PushRequest& h = headers[s];
    p->frames_[s] = MakeFrame(h, payloads[s]);
    const uint64_t id = h.request_id();
    Shard& shard = *shards_[s];
    grpc::ByteBuffer* frame = &p->frames_[s];
    PushResponse* response = &p->responses_[s];
    calls.push_back(StreamCall(
        s, shard.pushes[connection % shard.pushes.size()].get(),
        [frame] { return *frame; }, [id] { return id; },
        [response](const grpc::ByteBuffer& answer) {
          return ReadPushAnswer(answer, response);
        }));
  }
  auto fanout = std::make_unique<FanOut>(Env(), what, CallPolicy());
  fanout->Start(std::move(calls));
  PendingRowsPush* raw_call = p.get();
  p->call_.Start(std::move(fanout),
                 [raw_call](absl::Status s) { return raw_call->Finish(s); });
  return p;
}

}  // namespace asyncps
