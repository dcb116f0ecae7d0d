#ifndef ASYNCPS_SERVING_INFERENCE_PROTOCOL_H_
#define ASYNCPS_SERVING_INFERENCE_PROTOCOL_H_

// The Open Inference Protocol (KServe v2) for ps_serve's model, shared by
// the gRPC service and the REST form (whose JSON and binary mapping is
// serving/rest_protocol.h): checking and decoding a ModelInferRequest into
// feature rows, encoding the answer, the model's metadata.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/grpc_predict_v2.pb.h"
#include "serving/batcher.h"

namespace asyncps {

// The served model's one input and one output.
struct ModelSignature {
  std::string name;        // "mlp"
  std::string version;     // "1"
  std::string platform;    // "asyncps_mlp"
  std::string input_name;  // "input": FP32 [-1, input_dim] (0: none)
  int input_dim = 0;
  std::string ids_name;  // "ids": INT64 [-1, ids_per_row] (0: none)
  int ids_per_row = 0;
  std::string output_name;  // "probabilities": FP32 [-1, output_dim]
  int output_dim = 0;
  int max_rows = 0;  // rows one request may hold
};

// A checked request, ready for Batcher::Submit.
struct DecodedRequest {
  std::vector<float> x;       // rows x input_dim
  std::vector<uint64_t> ids;  // rows x ids_per_row
  int rows = 0;
  bool raw_output = false;  // the input came as raw_input_contents
  // The request's "timeout_ms" parameter, when given (> 0).
  absl::Duration timeout = absl::InfiniteDuration();
};

// NOT_FOUND for another model or version; INVALID_ARGUMENT (saying what is
// expected) for anything else than the model's inputs, each once, by name:
// the FP32 features [rows, input_dim] (or [input_dim] for one row) and the
// INT64 (or UINT64) ids [rows, ids_per_row], of equal rows in [1,
// max_rows], values in contents or raw_input_contents (one entry per input
// in order; not both), features finite, and outputs that name only the
// model's output.
absl::StatusOr<DecodedRequest> DecodeInferRequest(
    const ModelSignature& model, const inference::ModelInferRequest& request);

// The answer: the output (shape [rows, output_dim]) in raw_output_contents
// when `raw`, else in contents.fp32_contents; parameters snapshot_id,
// snapshot_version (updates applied to the parameters it used),
// snapshot_age_ms and batch_rows.
void EncodeInferResponse(const ModelSignature& model,
                         const inference::ModelInferRequest& request,
                         const InferResult& result, bool raw,
                         inference::ModelInferResponse* response);

inference::ModelMetadataResponse ModelMetadata(const ModelSignature& model);

// NOT_FOUND unless name (and version, when given) are the model's.
absl::Status CheckModel(const ModelSignature& model, const std::string& name,
                        const std::string& version);

}  // namespace asyncps

#endif  // ASYNCPS_SERVING_INFERENCE_PROTOCOL_H_
