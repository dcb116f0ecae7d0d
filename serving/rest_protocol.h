#ifndef ASYNCPS_SERVING_REST_PROTOCOL_H_
#define ASYNCPS_SERVING_REST_PROTOCOL_H_

// The REST form of the Open Inference Protocol (KServe v2): the JSON
// mapping of requests and answers, and the binary tensor data extension
// (as KServe and Triton publish it). A body is a JSON header, then, when
// the `Inference-Header-Content-Length` HTTP header gives the JSON's
// length, the raw little-endian bytes of the binary inputs in input order:
//
//   {"inputs":[{"name":"input","datatype":"FP32","shape":[2,784],
//               "parameters":{"binary_data_size":6272}}],
//    "outputs":[{"name":"probabilities","parameters":{"binary_data":true}}]}
//   <6272 bytes: 2 x 784 floats>
//
// Inputs may mix binary data and JSON "data". Outputs come back as raw
// bytes after the JSON answer when asked (per output "binary_data", or
// "binary_data_output" in the request's parameters); the answer's JSON
// then names each binary output's "binary_data_size" and its length goes
// in the answer's Inference-Header-Content-Length.
//
// Example (the REST endpoint):
//
//   absl::StatusOr<RestInferRequest> r = ParseRestInferRequest(
//       body, req.get_header_value(kInferenceHeaderLength), "mlp");
//   if (!r.ok()) return Refuse(r.status());          // 400, nothing computed
//   ... handler->Infer(r->request, ..., &response) ...
//   RestAnswer a = EncodeRestInferResponse(response, r->outputs);
//   if (a.has_binary) SetHeader(kInferenceHeaderLength, a.json_length);

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/grpc_predict_v2.pb.h"

namespace asyncps {

inline constexpr char kInferenceHeaderLength[] =
    "Inference-Header-Content-Length";

// Which outputs of an answer go as raw bytes.
struct RestOutputs {
  bool all_binary = false;  // the request's "binary_data_output"
  // Outputs the request named with a "binary_data" parameter.
  std::vector<std::pair<std::string, bool>> named;

  bool Binary(const std::string& output) const;
};

struct RestInferRequest {
  // Binary inputs (and, in a mix, the JSON ones, converted) arrive in
  // raw_input_contents, one entry per input; all-JSON requests in contents.
  inference::ModelInferRequest request;
  RestOutputs outputs;
};

// `body` is the (decompressed) request body; `header_length` the value of
// its Inference-Header-Content-Length header ("" when absent: the whole
// body is JSON). INVALID_ARGUMENT, with a message, for malformed JSON or
// fields of the wrong type (data flat or nested row-major; INT64/UINT64
// data integers up to 2^53), a header length that is not a number or lies
// beyond the body, a binary_data_size that disagrees with its input's
// shape and datatype, binary data that ends before the inputs' sizes do
// (a truncated body), or bytes left over after them.
absl::StatusOr<RestInferRequest> ParseRestInferRequest(
    absl::string_view body, absl::string_view header_length,
    const std::string& model_name);

// An answer's body: its JSON, then the binary outputs' bytes in order.
struct RestAnswer {
  std::string body;
  size_t json_length = 0;  // the JSON's bytes at the start of `body`
  bool has_binary = false;
};

// The answer for `response` (FP32 outputs, from contents or
// raw_output_contents), outputs in binary where `outputs` says so.
RestAnswer EncodeRestInferResponse(
    const inference::ModelInferResponse& response, const RestOutputs& outputs);

std::string ModelMetadataToJson(const inference::ModelMetadataResponse& m);
// {"error": message}
std::string ErrorJson(absl::string_view message);

}  // namespace asyncps

#endif  // ASYNCPS_SERVING_REST_PROTOCOL_H_
