#ifndef ASYNCPS_SERVING_SERVED_MODEL_H_
#define ASYNCPS_SERVING_SERVED_MODEL_H_

// Which model ps_serve serves, read from the specs the parameter source
// holds: its snapshot tensors, its protocol signature and a factory of batch
// runners (one per batch thread).

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/asyncps.pb.h"
#include "serving/batcher.h"
#include "serving/inference_protocol.h"
#include "serving/row_cache.h"

namespace asyncps {

struct ServedModel {
  std::vector<std::string> tensors;  // the snapshot's, in runner order
  ModelSignature signature;          // name and max_rows left to the caller
  Batcher::RunnerFactory runners;
  std::string summary;  // "mlp 784-256-128-10" for logs
};

// `kind` "mlp" (ps_worker's classifier: input "input" FP32 [rows, 784],
// output "probabilities") or "ctr" (the click model: inputs "dense" FP32
// [rows, dense_features] and "ids" INT64 [rows, fields], output
// "click_probability" [rows, 1]; embedding rows through `rows`, which must
// then be set and outlive the runners). FAILED_PRECONDITION when the specs
// hold no such model (yet); INVALID_ARGUMENT for another kind.
absl::StatusOr<ServedModel> DescribeServedModel(
    const std::string& kind, const ListTensorsResponse& specs, int max_batch,
    const std::string& device, RowCache* rows);

}  // namespace asyncps

#endif  // ASYNCPS_SERVING_SERVED_MODEL_H_
