#include "serving/served_model.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "serving/served_ctr.h"
#include "serving/served_mlp.h"

namespace asyncps {

absl::StatusOr<ServedModel> DescribeServedModel(
    const std::string& kind, const ListTensorsResponse& specs, int max_batch,
    const std::string& device, RowCache* rows) {
  ServedModel m;
  m.signature.version = "1";
  if (kind == "mlp") {
    absl::StatusOr<std::vector<int>> layers =
        MlpLayersFromSpecs({specs.tensors().begin(), specs.tensors().end()});
    if (!layers.ok()) return layers.status();
    for (size_t l = 0; l + 1 < layers->size(); ++l) {
      m.tensors.push_back(absl::StrCat("fc", l, "/w"));
      m.tensors.push_back(absl::StrCat("fc", l, "/b"));
    }
    m.signature.platform = "asyncps_mlp";
    m.signature.input_name = "input";
    m.signature.input_dim = layers->front();
    m.signature.output_name = "probabilities";
    m.signature.output_dim = layers->back();
    m.summary = absl::StrCat("mlp ", absl::StrJoin(*layers, "-"));
    m.runners = [layers = *layers, max_batch,
                 device]() -> absl::StatusOr<std::unique_ptr<BatchRunner>> {
      absl::StatusOr<std::unique_ptr<MlpRunner>> r =
          MlpRunner::Create(layers, max_batch, device);
      if (!r.ok()) return r.status();
      return std::unique_ptr<BatchRunner>(*std::move(r));
    };
    return m;
  }
  if (kind == "ctr") {
    if (rows == nullptr) {
      return absl::InvalidArgumentError("the ctr model needs a row cache");
    }
    absl::StatusOr<CtrModelConfig> config = CtrConfigFromSpecs(specs);
    if (!config.ok()) return config.status();
    m.tensors = CtrDenseNames(*config);
    m.signature.platform = "asyncps_ctr";
    m.signature.input_name = "dense";
    m.signature.input_dim = config->dense_features;
    m.signature.ids_name = "ids";
    m.signature.ids_per_row = config->fields;
    m.signature.output_name = "click_probability";
    m.signature.output_dim = 1;
    m.summary = absl::StrCat("ctr: ", config->fields, " fields of dim ",
                             config->embedding_dim, ", ",
                             config->dense_features, " dense features, MLP ",
                             absl::StrJoin(config->hidden, "-"));
    m.runners = [config = *config, max_batch, device,
                 rows]() -> absl::StatusOr<std::unique_ptr<BatchRunner>> {
      absl::StatusOr<std::unique_ptr<CtrRunner>> r =
          CtrRunner::Create(config, max_batch, device, rows);
      if (!r.ok()) return r.status();
      return std::unique_ptr<BatchRunner>(*std::move(r));
    };
    return m;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--model must be mlp or ctr, got '", kind, "'"));
}

}  // namespace asyncps
