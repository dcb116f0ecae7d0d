#include "worker/local_store.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "common/payload.h"
#include "common/tensor_layout.h"
#include "store/shard_store.h"
#include "worker/store_calls.h"

namespace asyncps {
namespace {

// What a local push summary counts: the store's answer, as the cluster's
// client counts it.
PushSummary Summarize(const PushResponse& resp) {
  PushSummary summary;
  uint64_t sum = 0;
  for (const SliceResult& r : resp.results()) {
    ++summary.applied;
    sum += r.staleness();
    summary.max_staleness = std::max(summary.max_staleness, r.staleness());
  }
  for (const RowsResult& r : resp.row_results()) {
    summary.rows.applied += r.applied();
    summary.rows_created += r.rows_created();
    sum += r.staleness_sum();
    summary.max_staleness = std::max(summary.max_staleness, r.max_staleness());
  }
  summary.applied += summary.rows.applied;
  if (summary.applied > 0) {
    summary.mean_staleness = static_cast<double>(sum) / summary.applied;
  }
  return summary;
}

class LocalStore : public ParameterStore {
 public:
  explicit LocalStore(std::unique_ptr<ShardStore> store)
      : store_(std::move(store)) {}

  absl::Status Create(const std::vector<TensorSpec>& tensors,
                      const std::vector<TableSpec>& tables) override {
    CreateTensorRequest req;
    for (const TensorSpec& s : tensors) *req.add_tensors() = s;
    for (const TableSpec& s : tables) *req.add_tables() = s;
    absl::StatusOr<CreateTensorResponse> r = store_->CreateTensors(req);
    if (!r.ok()) return r.status();
    for (const TensorSpec& s : r->tensors()) {
      layouts_.insert_or_assign(s.name(), *TensorLayout::FromSpec(s));
    }
    return absl::OkStatus();
  }

  absl::Status WaitFor(const std::vector<std::string>& names,
                       absl::Duration) override {
    for (const std::string& n : names) {
      if (!layouts_.contains(n) && !store_->tables().Contains(n)) {
        return absl::NotFoundError(
            absl::StrCat("unknown tensor or table ", QuoteName(n)));
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Registration> Register() override { return Registration(); }

  // The store answers every row position, duplicates included, so the rows
  // go straight into the callers' buffers.
  std::unique_ptr<PendingPull> StartPull(int64_t clock, int64_t for_clock,
                                         const PullSet& what) override {
    ReadSet read;
    read.epochs = {{0, 1}};
    int64_t created = 0;
    absl::Status s = PullTensors(what, &read);
    if (s.ok()) s = PullRows(std::max(clock, for_clock), what, &read, &created);
    if (!s.ok()) {  // a failed pull read nothing
      read = ReadSet();
      created = 0;
    }
    return std::make_unique<DonePull>(std::move(s), std::move(read), created);
  }

  // Tensors and rows in one prepared push: applied whole or not at all.
  std::unique_ptr<PendingPush> StartPush(int64_t clock, const PushSet& what,
                                         const ReadSet& read) override {
    PushRequest req;
    req.mutable_worker()->set_clock(clock);
    std::vector<Payload> grads;
    absl::Status s = AddTensorGrads(what, read, &req, &grads);
    if (s.ok()) s = AddRowGrads(what, read, &req);
    if (!s.ok()) return std::make_unique<DonePush>(s);
    const std::vector<Payload> rows = TableStore::PayloadsOf(req);
    absl::StatusOr<ShardStore::PreparedPush> prepared =
        store_->PreparePush(req, grads, rows, PushMode::kApply);
    if (!prepared.ok()) return std::make_unique<DonePush>(prepared.status());
    PushResponse resp;
    store_->CommitPush(&*prepared, StalenessRule{}, &resp);
    return std::make_unique<DonePush>(Summarize(resp));
  }

  absl::Status Heartbeat(int64_t, bool) override { return absl::OkStatus(); }
  void ReportTrained(int64_t) override {}
  absl::StatusOr<int> LiveWorkers() override { return 0; }

 private:
  absl::Status PullTensors(const PullSet& what, ReadSet* read) {
    if (what.tensors.empty()) return absl::OkStatus();
    PullRequest req;
    absl::flat_hash_map<std::string, float*> dest;
    for (const auto& [name, out] : what.tensors) {
      auto it = layouts_.find(name);
      if (it == layouts_.end()) {
        return absl::NotFoundError(
            absl::StrCat("unknown tensor ", QuoteName(name)));
      }
      if (out == nullptr || !dest.emplace(name, out).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Pull: null buffer or a name twice: ", QuoteName(name)));
      }
      req.add_tensors(name);
      read->versions[name].assign(it->second.num_slices(), 0);
    }
    return store_->Pull(
        req, [&](const std::string& tensor, uint32_t slice, uint64_t version,
                 absl::Span<const float> values) {
          std::copy(values.begin(), values.end(),
                    dest[tensor] + layouts_.at(tensor).SliceBegin(slice));
          read->versions[tensor][slice] = version;
        });
  }

  // *created: the rows the pull created.
  absl::Status PullRows(int64_t clock, const PullSet& what, ReadSet* read,
                        int64_t* created) {
    PullRequest req;
    std::vector<float*> outs;
    for (const RowsQuery& q : what.rows) {
      if (q.ids.empty()) continue;
      TableIds* t = req.add_rows();
      t->set_table(q.table);
      t->set_peek(q.peek);
      t->mutable_ids()->Add(q.ids.begin(), q.ids.end());
      outs.push_back(q.out);
    }
    if (outs.empty()) return absl::OkStatus();
    PullResponse resp;
    absl::Status s = store_->tables().Pull(
        req, clock, WIRE_F32, &resp,
        [&outs](int k, size_t) { return reinterpret_cast<char*>(outs[k]); });
    if (!s.ok()) return s;
    for (int k = 0; k < resp.rows_size(); ++k) {
      auto table = std::make_shared<ReadSet::Table>();
      const TableIds& asked = req.rows(k);
      for (int i = 0; i < asked.ids_size(); ++i) {
        const auto [it, fresh] = table->index.try_emplace(
            asked.ids(i), static_cast<uint32_t>(table->versions.size()));
        if (fresh) table->versions.push_back(resp.rows(k).versions(i));
      }
      read->tables[asked.table()] = std::move(table);
      *created += static_cast<int64_t>(resp.rows(k).rows_created());
    }
    return absl::OkStatus();
  }

  absl::Status AddTensorGrads(const PushSet& what, const ReadSet& read,
                              PushRequest* req, std::vector<Payload>* grads) {
    for (const auto& [name, g] : what.tensors) {
      auto it = layouts_.find(name);
      if (it == layouts_.end() || g == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Push: unknown tensor or null gradient: ", QuoteName(name)));
      }
      const TensorLayout& layout = it->second;
      auto versions = read.versions.find(name);
      for (uint32_t i = 0; i < layout.num_slices(); ++i) {
        SliceGradient* sg = req->add_grads();
        sg->set_tensor(name);
        sg->set_slice(i);
        if (versions != read.versions.end() && i < versions->second.size()) {
          sg->set_read_version(versions->second[i]);
        }
        grads->emplace_back(absl::string_view(
            reinterpret_cast<const char*>(g + layout.SliceBegin(i)),
            layout.SliceSize(i) * sizeof(float)));
      }
    }
    return absl::OkStatus();
  }

  absl::Status AddRowGrads(const PushSet& what, const ReadSet& read,
                           PushRequest* req) {
    for (const RowsGrad& g : what.rows) {
      if (g.ids.empty()) continue;
      const SparseTable* table = store_->tables().Find(g.table);
      if (table == nullptr || g.grads == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Push: unknown table ", QuoteName(g.table), " or null gradients"));
      }
      RowsGradient* r = req->add_rows();
      r->set_table(g.table);
      r->mutable_ids()->Add(g.ids.begin(), g.ids.end());
      for (uint64_t id : g.ids) {
        r->add_read_versions(read.VersionOf(g.table, id));
      }
      r->set_grad(std::string(reinterpret_cast<const char*>(g.grads),
                              g.ids.size() * table->dim() * sizeof(float)));
    }
    return absl::OkStatus();
  }

  std::unique_ptr<ShardStore> store_;
  absl::flat_hash_map<std::string, TensorLayout> layouts_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ParameterStore>> MakeLocalStore() {
  absl::StatusOr<std::unique_ptr<ShardStore>> store =
      ShardStore::Create(ShardStoreOptions{});
  if (!store.ok()) return store.status();
  return std::unique_ptr<ParameterStore>(
      std::make_unique<LocalStore>(*std::move(store)));
}

}  // namespace asyncps
