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

class LocalStore : public ParameterStore {
 public:
  explicit LocalStore(std::unique_ptr<ShardStore> store)
      : store_(std::move(store)) {}

  absl::Status Create(const std::vector<TensorSpec>& specs) override {
    CreateTensorRequest req;
    for (const TensorSpec& s : specs) *req.add_tensors() = s;
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
      if (!layouts_.contains(n)) {
        return absl::NotFoundError(
            absl::StrCat("unknown tensor ", QuoteName(n)));
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Registration> Register() override { return Registration(); }

  std::unique_ptr<PendingPull> StartPull(
      int64_t, int64_t,
      const std::vector<std::pair<std::string, float*>>& outs) override {
    PullRequest req;
    absl::flat_hash_map<std::string, float*> dest;
    ReadSet read;
    read.epochs = {1};
    for (const auto& [name, out] : outs) {
      auto it = layouts_.find(name);
      if (it == layouts_.end()) {
        return std::make_unique<DonePull>(
            absl::NotFoundError(
                absl::StrCat("unknown tensor ", QuoteName(name))),
            ReadSet());
      }
      if (out == nullptr || !dest.emplace(name, out).second) {
        return std::make_unique<DonePull>(
            absl::InvalidArgumentError(absl::StrCat(
                "Pull: null buffer or a name twice: ", QuoteName(name))),
            ReadSet());
      }
      req.add_tensors(name);
      read.versions[name].assign(it->second.num_slices(), 0);
    }
    absl::Status s = store_->Pull(
        req, [&](const std::string& tensor, uint32_t slice, uint64_t version,
                 absl::Span<const float> values) {
          std::copy(values.begin(), values.end(),
                    dest[tensor] + layouts_.at(tensor).SliceBegin(slice));
          read.versions[tensor][slice] = version;
        });
    return std::make_unique<DonePull>(s, std::move(read));
  }

  std::unique_ptr<PendingPush> StartPush(
      int64_t, const std::vector<std::pair<std::string, const float*>>& grads,
      const ReadSet& read) override {
    PushRequest req;
    std::vector<Payload> payloads;
    for (const auto& [name, g] : grads) {
      auto it = layouts_.find(name);
      if (it == layouts_.end() || g == nullptr) {
        return std::make_unique<DonePush>(
            absl::InvalidArgumentError(absl::StrCat(
                "Push: unknown tensor or null gradient: ", QuoteName(name))));
      }
      const TensorLayout& layout = it->second;
      auto versions = read.versions.find(name);
      for (uint32_t i = 0; i < layout.num_slices(); ++i) {
        SliceGradient* sg = req.add_grads();
        sg->set_tensor(name);
        sg->set_slice(i);
        if (versions != read.versions.end() && i < versions->second.size()) {
          sg->set_read_version(versions->second[i]);
        }
        payloads.emplace_back(absl::string_view(
            reinterpret_cast<const char*>(g + layout.SliceBegin(i)),
            layout.SliceSize(i) * sizeof(float)));
      }
    }
    absl::StatusOr<ShardStore::PreparedPush> prepared =
        store_->PreparePush(req, payloads, /*rows=*/{}, PushMode::kApply);
    if (!prepared.ok()) return std::make_unique<DonePush>(prepared.status());
    PushResponse resp;
    store_->CommitPush(&*prepared, StalenessRule{}, &resp);
    PushSummary summary;
    uint64_t sum = 0;
    for (const SliceResult& r : resp.results()) {
      ++summary.applied;
      sum += r.staleness();
      summary.max_staleness = std::max(summary.max_staleness, r.staleness());
    }
    if (summary.applied > 0) {
      summary.mean_staleness = static_cast<double>(sum) / summary.applied;
    }
    return std::make_unique<DonePush>(summary);
  }

  absl::Status Heartbeat(int64_t, bool) override { return absl::OkStatus(); }
  void ReportTrained(int64_t) override {}
  absl::StatusOr<int> LiveWorkers() override { return 0; }

 private:
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
