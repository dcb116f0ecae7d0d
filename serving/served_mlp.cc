#include "serving/served_mlp.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace asyncps {

absl::StatusOr<std::vector<int>> MlpLayersFromSpecs(
    const std::vector<TensorSpec>& specs) {
  absl::flat_hash_map<std::string, const TensorSpec*> by_name;
  for (const TensorSpec& spec : specs) by_name[spec.name()] = &spec;
  std::vector<int> layers;
  for (int l = 0;; ++l) {
    auto w = by_name.find(absl::StrCat("fc", l, "/w"));
    if (w == by_name.end()) break;
    auto b = by_name.find(absl::StrCat("fc", l, "/b"));
    const TensorSpec& ws = *w->second;
    if (ws.shape_size() != 2 || b == by_name.end() ||
        b->second->shape_size() != 1 || b->second->shape(0) != ws.shape(1)) {
      return absl::FailedPreconditionError(
          absl::StrCat("tensors fc", l, "/w and fc", l,
                       "/b are not an MLP layer ([in, out] and [out])"));
    }
    if (l == 0) {
      layers.push_back(static_cast<int>(ws.shape(0)));
    } else if (ws.shape(0) != layers.back()) {
      return absl::FailedPreconditionError(
          absl::StrCat("fc", l, "/w takes ", ws.shape(0), " inputs; fc", l - 1,
                       " gives ", layers.back()));
    }
    layers.push_back(static_cast<int>(ws.shape(1)));
  }
  if (layers.size() < 2) {
    return absl::FailedPreconditionError(
        "no MLP tensors (fc0/w, fc0/b, ...): is ps_worker --model=mlp "
        "training on these shards?");
  }
  return layers;
}

absl::StatusOr<std::unique_ptr<MlpRunner>> MlpRunner::Create(
    const std::vector<int>& layer_sizes, int max_batch,
    const std::string& device) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend(device);
  if (!backend.ok()) return backend.status();
  absl::StatusOr<std::unique_ptr<Mlp>> mlp =
      Mlp::Create(layer_sizes, max_batch, backend->get());
  if (!mlp.ok()) return mlp.status();
  return std::unique_ptr<MlpRunner>(
      new MlpRunner(*std::move(backend), *std::move(mlp)));
}

absl::Status MlpRunner::Run(const Snapshot& snapshot, const float* x,
                            const uint64_t* /*ids*/, int rows, float* out) {
  if (loaded_ != snapshot.id) {
    std::vector<const float*> params;
    for (const std::vector<float>& v : snapshot.values)
      params.push_back(v.data());
    loaded_ = 0;
    absl::Status s = mlp_->LoadParams(params);
    if (!s.ok()) return s;
    loaded_ = snapshot.id;
  }
  return mlp_->Predict(x, rows, out);
}

}  // namespace asyncps
