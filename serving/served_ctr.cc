#include "serving/served_ctr.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace asyncps {

absl::StatusOr<CtrModelConfig> CtrConfigFromSpecs(
    const ListTensorsResponse& specs) {
  absl::flat_hash_map<std::string, const TableSpec*> tables;
  for (const TableSpec& t : specs.tables()) tables[t.name()] = &t;
  absl::flat_hash_map<std::string, const TensorSpec*> tensors;
  for (const TensorSpec& t : specs.tensors()) tensors[t.name()] = &t;
  CtrModelConfig config;
  config.fields = 0;
  while (tables.contains(CtrTableName(config.fields))) ++config.fields;
  if (config.fields == 0) {
    return absl::FailedPreconditionError(
        "no embedding tables (ctr/emb0, ...): is ps_worker --model=ctr "
        "training on these shards?");
  }
  config.embedding_dim = tables[CtrTableName(0)]->dim();
  for (int f = 1; f < config.fields; ++f) {
    if (tables[CtrTableName(f)]->dim() != config.embedding_dim) {
      return absl::FailedPreconditionError(absl::StrCat(
          CtrTableName(f), " has dim ", tables[CtrTableName(f)]->dim(), ", ",
          CtrTableName(0), " ", config.embedding_dim));
    }
  }
  std::vector<int> widths;  // input, then every layer's output
  for (int l = 0;; ++l) {
    auto w = tensors.find(absl::StrCat("ctr/fc", l, "/w"));
    if (w == tensors.end()) break;
    auto b = tensors.find(absl::StrCat("ctr/fc", l, "/b"));
    const TensorSpec& ws = *w->second;
    if (ws.shape_size() != 2 || b == tensors.end() ||
        b->second->shape_size() != 1 || b->second->shape(0) != ws.shape(1) ||
        (l > 0 && ws.shape(0) != widths.back())) {
      return absl::FailedPreconditionError(
          absl::StrCat("ctr/fc", l, "/w and ctr/fc", l,
                       "/b do not continue the click model's MLP"));
    }
    if (l == 0) widths.push_back(static_cast<int>(ws.shape(0)));
    widths.push_back(static_cast<int>(ws.shape(1)));
  }
  if (widths.size() < 2 || widths.back() != 1) {
    return absl::FailedPreconditionError(
        "no click-model MLP (ctr/fc0/w ... ending in one logit)");
  }
  config.hidden.assign(widths.begin() + 1, widths.end() - 1);
  const int f = config.fields, d = config.embedding_dim;
  config.dot_interactions = true;
  config.dense_features = widths[0] - f * d - f * (f - 1) / 2;
  if (config.dense_features < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the MLP takes ", widths[0], " inputs, fewer than ", f, " fields x ", d,
        " plus their ", f * (f - 1) / 2, " dot products"));
  }
  return config;
}

std::vector<std::string> CtrDenseNames(const CtrModelConfig& config) {
  std::vector<std::string> names;
  for (size_t l = 0; l <= config.hidden.size(); ++l) {
    names.push_back(absl::StrCat("ctr/fc", l, "/w"));
    names.push_back(absl::StrCat("ctr/fc", l, "/b"));
  }
  return names;
}

absl::StatusOr<std::unique_ptr<CtrRunner>> CtrRunner::Create(
    const CtrModelConfig& config, int max_batch, const std::string& device,
    RowCache* rows) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend(device);
  if (!backend.ok()) return backend.status();
  absl::StatusOr<std::unique_ptr<CtrModel>> model =
      CtrModel::Create(config, max_batch, backend->get());
  if (!model.ok()) return model.status();
  return std::unique_ptr<CtrRunner>(
      new CtrRunner(*std::move(backend), *std::move(model), rows));
}

absl::Status CtrRunner::Run(const Snapshot& snapshot, const float* x,
                            const uint64_t* ids, int rows, float* out) {
  const CtrModelConfig& c = model_->config();
  const size_t block = static_cast<size_t>(rows) * c.embedding_dim;
  emb_.resize(c.fields * block);
  field_ids_.resize(rows);
  for (int f = 0; f < c.fields; ++f) {
    for (int r = 0; r < rows; ++r) field_ids_[r] = ids[r * c.fields + f];
    absl::Status s =
        rows_->Lookup(snapshot.id, CtrTableName(f), c.embedding_dim, field_ids_,
                      emb_.data() + f * block);
    if (!s.ok()) return s;
  }
  std::vector<const float*> params;
  for (const std::vector<float>& v : snapshot.values)
    params.push_back(v.data());
  return model_->Predict(params, emb_.data(), x, rows, out);
}

}  // namespace asyncps
