#include "worker/parameter_store.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/float_codec.h"
#include "server/shard_store.h"

namespace asyncps {
namespace {

class RemoteStore : public ParameterStore {
 public:
  explicit RemoteStore(std::unique_ptr<PsClient> client)
      : client_(std::move(client)) {}

  absl::Status Create(const std::vector<TensorSpec>& specs) override {
    return client_->CreateTensors(specs);
  }
  absl::Status WaitFor(const std::vector<std::string>& names,
                       absl::Duration timeout) override {
    return client_->WaitForTensors(names, timeout);
  }
  absl::Status Pull(
      int64_t clock,
      const std::vector<std::pair<std::string, float*>>& outs) override {
    return client_->Pull(clock, outs);
  }
  absl::StatusOr<PushSummary> Push(
      int64_t clock,
      const std::vector<std::pair<std::string, const float*>>& grads) override {
    return client_->Push(clock, grads);
  }
  absl::Status Heartbeat(int64_t clock, bool leaving) override {
    return client_->Heartbeat(clock, leaving);
  }
  absl::StatusOr<int> LiveWorkers() override {
    absl::StatusOr<std::vector<StatusResponse>> status = client_->Status();
    if (!status.ok()) return status.status();
    int live = 0;
    for (const StatusResponse& shard : *status) {
      int n = 0;
      for (const WorkerStatus& w : shard.workers()) n += w.live() ? 1 : 0;
      live = std::max(live, n);
    }
    return live;
  }

 private:
  std::unique_ptr<PsClient> client_;
};

// One in-process shard; tensors are pulled and pushed whole, slice by slice.
class LocalStore : public ParameterStore {
 public:
  LocalStore() : store_(ShardStore::Create(ShardStoreOptions{}).value()) {}

  absl::Status Create(const std::vector<TensorSpec>& specs) override {
    CreateTensorRequest req;
    for (const TensorSpec& s : specs) *req.add_tensors() = s;
    absl::StatusOr<CreateTensorResponse> r = store_->CreateTensors(req);
    if (!r.ok()) return r.status();
    for (const TensorSpec& s : r->tensors()) specs_[s.name()] = s;
    return absl::OkStatus();
  }
  absl::Status WaitFor(const std::vector<std::string>& names,
                       absl::Duration) override {
    for (const std::string& n : names) {
      if (!specs_.contains(n)) {
        return absl::NotFoundError(absl::StrCat("unknown tensor '", n, "'"));
      }
    }
    return absl::OkStatus();
  }
  // Slices go straight between the caller's buffers and the store, through
  // the same validation and optimizer code as a shard, without encoding.
  absl::Status Pull(
      int64_t, const std::vector<std::pair<std::string, float*>>& outs) override {
    PullRequest req;
    absl::flat_hash_map<std::string, float*> dest;
    for (const auto& [name, out] : outs) {
      req.add_tensors(name);
      dest[name] = out;
    }
    return store_->Pull(req, [&](const std::string& tensor, uint32_t slice,
                                 uint64_t version,
                                 absl::Span<const float> values) {
      std::copy(values.begin(), values.end(),
                dest[tensor] + slice * specs_.at(tensor).slice_elems());
      versions_[{tensor, slice}] = version;
    });
  }
  absl::StatusOr<PushSummary> Push(
      int64_t,
      const std::vector<std::pair<std::string, const float*>>& grads) override {
    PushRequest req;
    std::vector<FloatPayload> payloads;
    for (const auto& [name, g] : grads) {
      auto it = specs_.find(name);
      if (it == specs_.end()) {
        return absl::NotFoundError(absl::StrCat("unknown tensor '", name, "'"));
      }
      const TensorLayout layout = TensorLayout::FromSpec(it->second).value();
      for (uint32_t s = 0; s < layout.num_slices(); ++s) {
        SliceGradient* sg = req.add_grads();
        sg->set_tensor(name);
        sg->set_slice(s);
        sg->set_read_version(versions_[{name, s}]);
        payloads.emplace_back(absl::string_view(
            reinterpret_cast<const char*>(g + layout.SliceBegin(s)),
            layout.SliceSize(s) * sizeof(float)));
      }
    }
    absl::StatusOr<std::vector<ShardStore::Slice*>> slices =
        store_->ValidatePush(req, payloads);
    if (!slices.ok()) return slices.status();
    PushResponse resp;
    store_->ApplyPush(req, payloads, *slices, StalenessRule{}, &resp);
    PushSummary summary;
    summary.applied = resp.results_size();
    return summary;
  }
  absl::Status Heartbeat(int64_t, bool) override { return absl::OkStatus(); }
  absl::StatusOr<int> LiveWorkers() override { return 0; }

 private:
  std::unique_ptr<ShardStore> store_;
  absl::flat_hash_map<std::string, TensorSpec> specs_;
  absl::flat_hash_map<std::pair<std::string, uint32_t>, uint64_t> versions_;
};

}  // namespace

std::unique_ptr<ParameterStore> MakeRemoteStore(
    std::unique_ptr<PsClient> client) {
  return std::make_unique<RemoteStore>(std::move(client));
}

std::unique_ptr<ParameterStore> MakeLocalStore() {
  return std::make_unique<LocalStore>();
}

}  // namespace asyncps
