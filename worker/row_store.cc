#include "worker/row_store.h"

#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "store/shard_store.h"
#include "worker/store_calls.h"

namespace asyncps {
namespace {

class RemoteRowStore : public RowStore {
 public:
  explicit RemoteRowStore(PsClient* client) : client_(client) {}

  absl::Status CreateTables(const std::vector<TableSpec>& specs) override {
    return client_->CreateTables(specs);
  }
  absl::Status WaitForTables(const std::vector<std::string>& names,
                             absl::Duration timeout) override {
    return client_->WaitForTensors(names, timeout);
  }
  std::unique_ptr<PendingPull> StartPullRows(
      int64_t clock, int64_t for_clock,
      const std::vector<RowsQuery>& queries) override {
    return std::make_unique<RemotePull<PsClient::PendingRowsPull>>(
        client_->StartPullRows(clock, for_clock, queries));
  }
  std::unique_ptr<PendingPush> StartPushRows(int64_t clock,
                                             const std::vector<RowsGrad>& grads,
                                             const ReadSet& read) override {
    return std::make_unique<RemotePush<PsClient::PendingRowsPush>>(
        client_->StartPushRows(clock, grads, read));
  }

 private:
  PsClient* const client_;
};

class LocalRowStore : public RowStore {
 public:
  explicit LocalRowStore(std::unique_ptr<ShardStore> store)
      : store_(std::move(store)) {}

  absl::Status CreateTables(const std::vector<TableSpec>& specs) override {
    CreateTensorRequest req;
    for (const TableSpec& s : specs) *req.add_tables() = s;
    return store_->CreateTensors(req).status();
  }

  absl::Status WaitForTables(const std::vector<std::string>& names,
                             absl::Duration) override {
    for (const std::string& n : names) {
      if (!store_->tables().Contains(n)) {
        return absl::NotFoundError(
            absl::StrCat("unknown table ", QuoteName(n)));
      }
    }
    return absl::OkStatus();
  }

  // The shard answers every position, duplicates included, so the rows go
  // straight into the callers' buffers.
  std::unique_ptr<PendingPull> StartPullRows(
      int64_t clock, int64_t for_clock,
      const std::vector<RowsQuery>& queries) override {
    PullRequest req;
    std::vector<float*> outs;
    for (const RowsQuery& q : queries) {
      if (q.ids.empty()) continue;
      TableIds* t = req.add_rows();
      t->set_table(q.table);
      t->set_peek(q.peek);
      t->mutable_ids()->Add(q.ids.begin(), q.ids.end());
      outs.push_back(q.out);
    }
    PullResponse resp;
    absl::Status s = store_->tables().Pull(
        req, std::max(clock, for_clock), WIRE_F32, &resp,
        [&outs](int k, size_t) { return reinterpret_cast<char*>(outs[k]); });
    ReadSet read;
    if (s.ok()) {
      for (int k = 0; k < resp.rows_size(); ++k) {
        auto table = std::make_shared<ReadSet::Table>();
        const TableIds& asked = req.rows(k);
        for (int i = 0; i < asked.ids_size(); ++i) {
          const auto [it, fresh] = table->index.try_emplace(
              asked.ids(i), static_cast<uint32_t>(table->versions.size()));
          if (fresh) table->versions.push_back(resp.rows(k).versions(i));
        }
        read.tables[asked.table()] = std::move(table);
      }
    }
    return std::make_unique<DonePull>(std::move(s), std::move(read));
  }

  std::unique_ptr<PendingPush> StartPushRows(int64_t clock,
                                             const std::vector<RowsGrad>& grads,
                                             const ReadSet& read) override {
    PushRequest req;
    req.mutable_worker()->set_clock(clock);
    for (const RowsGrad& g : grads) {
      if (g.ids.empty()) continue;
      const SparseTable* table = store_->tables().Find(g.table);
      if (table == nullptr || g.grads == nullptr) {
        return std::make_unique<DonePush>(absl::InvalidArgumentError(
            absl::StrCat("PushRows: unknown table ", QuoteName(g.table),
                         " or null gradients")));
      }
      RowsGradient* r = req.add_rows();
      r->set_table(g.table);
      r->mutable_ids()->Add(g.ids.begin(), g.ids.end());
      for (uint64_t id : g.ids)
        r->add_read_versions(read.VersionOf(g.table, id));
      r->set_grad(std::string(reinterpret_cast<const char*>(g.grads),
                              g.ids.size() * table->dim() * sizeof(float)));
    }
    const std::vector<Payload> rows = TableStore::PayloadsOf(req);
    absl::StatusOr<ShardStore::PreparedPush> prepared =
        store_->PreparePush(req, /*grads=*/{}, rows, PushMode::kApply);
    if (!prepared.ok()) return std::make_unique<DonePush>(prepared.status());
    PushResponse resp;
    store_->CommitPush(&*prepared, StalenessRule(), &resp);
    PushSummary summary;
    for (const RowsResult& r : resp.row_results()) {
      summary.applied += r.applied();
      summary.rows_created += r.rows_created();
    }
    return std::make_unique<DonePush>(summary);
  }

 private:
  std::unique_ptr<ShardStore> store_;
};

}  // namespace

std::unique_ptr<RowStore> MakeRemoteRowStore(PsClient* client) {
  return std::make_unique<RemoteRowStore>(client);
}

std::unique_ptr<RowStore> MakeLocalRowStore() {
  ShardStoreOptions o;
  return std::make_unique<LocalRowStore>(ShardStore::Create(o).value());
}

}  // namespace asyncps
