#include "serving/inference_protocol.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace asyncps {
namespace {

using inference::InferParameter;
using inference::ModelInferRequest;
using inference::ModelInferResponse;
using inference::ModelMetadataResponse;

std::string Expected(const ModelSignature& model) {
  std::string inputs;
  if (model.input_dim > 0) {
    absl::StrAppend(&inputs, "FP32 '", model.input_name, "' [rows, ",
                    model.input_dim, "]");
  }
  if (model.ids_per_row > 0) {
    absl::StrAppend(&inputs, inputs.empty() ? "" : " and ", "INT64 '",
                    model.ids_name, "' [rows, ", model.ids_per_row, "]");
  }
  return absl::StrCat("model '", model.name, "' takes ", inputs, ", 1 to ",
                      model.max_rows, " rows");
}

absl::Status Invalid(const ModelSignature& model, const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, " (", Expected(model), ")"));
}

// raw_input_contents `bytes` as `count` values of T into *out; `what`
// names the values in the error ("FP32 values").
template <typename T>
absl::Status CopyRaw(const ModelSignature& model, const std::string& bytes,
                     size_t count, absl::string_view what,
                     std::vector<T>* out) {
  if (bytes.size() != count * sizeof(T)) {
    return Invalid(model, absl::StrCat("raw_input_contents of ", bytes.size(),
                                       " bytes for ", count, " ", what));
  }
  out->resize(count);
  std::memcpy(out->data(), bytes.data(), count * sizeof(T));
  return absl::OkStatus();
}

// The rows of one input of shape [rows, width] (or [width] for one row).
absl::StatusOr<int64_t> Rows(const ModelSignature& model,
                             const ModelInferRequest::InferInputTensor& in,
                             int width) {
  if (in.shape_size() == 1 && in.shape(0) == width) return 1;
  if (in.shape_size() == 2 && in.shape(1) == width) {
    if (in.shape(0) < 1 || in.shape(0) > model.max_rows) {
      return Invalid(model, absl::StrCat(in.shape(0), " rows"));
    }
    return in.shape(0);
  }
  return Invalid(model, absl::StrCat("input '", in.name(), "' shape [",
                                     absl::StrJoin(in.shape(), ", "), "]"));
}

absl::StatusOr<absl::Duration> TimeoutParameter(
    const google::protobuf::Map<std::string, InferParameter>& parameters) {
  auto it = parameters.find("timeout_ms");
  if (it == parameters.end()) return absl::InfiniteDuration();
  const InferParameter& p = it->second;
  double ms = -1;
  if (p.parameter_choice_case() == InferParameter::kInt64Param) {
    ms = static_cast<double>(p.int64_param());
  } else if (p.parameter_choice_case() == InferParameter::kUint64Param) {
    ms = static_cast<double>(p.uint64_param());
  } else if (p.parameter_choice_case() == InferParameter::kDoubleParam) {
    ms = p.double_param();
  }
  if (!(ms > 0) || !std::isfinite(ms)) {
    return absl::InvalidArgumentError(
        "parameter timeout_ms must be a number of milliseconds > 0");
  }
  return absl::Milliseconds(ms);
}

}  // namespace

absl::Status CheckModel(const ModelSignature& model, const std::string& name,
                        const std::string& version) {
  if (name != model.name || (!version.empty() && version != model.version)) {
    return absl::NotFoundError(absl::StrCat(
        "no model '", name, "'", version.empty() ? "" : " version " + version,
        ": this server serves '", model.name, "' version ", model.version));
  }
  return absl::OkStatus();
}

namespace {

// The parts of a request that come before its values: as many inputs as
// the model has, one raw_input_contents per input when any, outputs that
// name only the model's output.
absl::Status CheckRequestShape(const ModelSignature& model,
                               const ModelInferRequest& request) {
  const int want = (model.input_dim > 0) + (model.ids_per_row > 0);
  if (request.inputs_size() != want) {
    return Invalid(model, absl::StrCat("the request has ",
                                       request.inputs_size(), " inputs"));
  }
  const bool raw = request.raw_input_contents_size() > 0;
  if (raw && request.raw_input_contents_size() != request.inputs_size()) {
    return Invalid(model, absl::StrCat(request.raw_input_contents_size(),
                                       " raw_input_contents for ",
                                       request.inputs_size(), " inputs"));
  }
  for (const auto& out : request.outputs()) {
    if (out.name() != model.output_name) {
      return Invalid(
          model, absl::StrCat("unknown output '", out.name(),
                              "'; the output is '", model.output_name, "'"));
    }
  }
  return absl::OkStatus();
}

// The FP32 features input: `count` values (rows x `width`), from `raw`
// (its raw_input_contents) when not null, else from its contents; finite.
absl::Status DecodeFeatures(const ModelSignature& model,
                            const ModelInferRequest::InferInputTensor& in,
                            const std::string* raw, size_t count, int width,
                            std::vector<float>* x) {
  if (in.datatype() != "FP32") {
    return Invalid(model, absl::StrCat("input '", in.name(), "' datatype '",
                                       in.datatype(), "'"));
  }
  if (raw != nullptr) {
    absl::Status s = CopyRaw(model, *raw, count, "FP32 values", x);
    if (!s.ok()) return s;
  } else {
    const auto& v = in.contents().fp32_contents();
    if (static_cast<size_t>(v.size()) != count) {
      return Invalid(model, absl::StrCat(v.size(), " fp32_contents values for ",
                                         count, " (the shape's)"));
    }
    x->assign(v.begin(), v.end());
  }
  for (size_t i = 0; i < count; ++i) {
    if (!std::isfinite((*x)[i])) {
      return Invalid(model, absl::StrCat("value ", i % width, " of row ",
                                         i / width, " is not finite"));
    }
  }
  return absl::OkStatus();
}

// The INT64 (or UINT64) ids input: `count` ids, from `raw` when not null,
// else from its contents.
absl::Status DecodeIds(const ModelSignature& model,
                       const ModelInferRequest::InferInputTensor& in,
                       const std::string* raw, size_t count,
                       std::vector<uint64_t>* ids) {
  const bool u64 = in.datatype() == "UINT64";
  if (in.datatype() != "INT64" && !u64) {
    return Invalid(model, absl::StrCat("input '", in.name(), "' datatype '",
                                       in.datatype(), "'"));
  }
  if (raw != nullptr) return CopyRaw(model, *raw, count, "64-bit ids", ids);
  if (u64) {
    const auto& v = in.contents().uint64_contents();
    if (static_cast<size_t>(v.size()) != count) {
      return Invalid(model, absl::StrCat(v.size(), " uint64_contents for ",
                                         count, " ids"));
    }
    ids->assign(v.begin(), v.end());
    return absl::OkStatus();
  }
  const auto& v = in.contents().int64_contents();
  if (static_cast<size_t>(v.size()) != count) {
    return Invalid(
        model, absl::StrCat(v.size(), " int64_contents for ", count, " ids"));
  }
  ids->assign(v.begin(), v.end());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DecodedRequest> DecodeInferRequest(
    const ModelSignature& model, const ModelInferRequest& request) {
  absl::Status s =
      CheckModel(model, request.model_name(), request.model_version());
  if (s.ok()) s = CheckRequestShape(model, request);
  if (!s.ok()) return s;
  const bool raw = request.raw_input_contents_size() > 0;
  DecodedRequest d;
  d.raw_output = raw;
  int64_t rows = -1;
  bool have_features = false, have_ids = false;
  for (int k = 0; k < request.inputs_size(); ++k) {
    const ModelInferRequest::InferInputTensor& in = request.inputs(k);
    if (raw && in.has_contents()) {
      return Invalid(model, "both raw_input_contents and contents are set");
    }
    const bool features = model.input_dim > 0 && in.name() == model.input_name;
    const bool ids = model.ids_per_row > 0 && in.name() == model.ids_name;
    if ((!features && !ids) || (features && have_features) ||
        (ids && have_ids)) {
      return Invalid(model, absl::StrCat("unexpected input '", in.name(), "'"));
    }
    const int width = features ? model.input_dim : model.ids_per_row;
    absl::StatusOr<int64_t> n = Rows(model, in, width);
    if (!n.ok()) return n.status();
    if (rows >= 0 && *n != rows) {
      return Invalid(model,
                     absl::StrCat("inputs of ", rows, " and ", *n, " rows"));
    }
    rows = *n;
    const size_t count = static_cast<size_t>(*n) * width;
    const std::string* contents =
        raw ? &request.raw_input_contents(k) : nullptr;
    if (features) {
      have_features = true;
      s = DecodeFeatures(model, in, contents, count, width, &d.x);
    } else {
      have_ids = true;
      s = DecodeIds(model, in, contents, count, &d.ids);
    }
    if (!s.ok()) return s;
  }
  d.rows = static_cast<int>(rows);
  absl::StatusOr<absl::Duration> timeout =
      TimeoutParameter(request.parameters());
  if (!timeout.ok()) return timeout.status();
  d.timeout = *timeout;
  return d;
}

void EncodeInferResponse(const ModelSignature& model,
                         const ModelInferRequest& request,
                         const InferResult& result, bool raw,
                         ModelInferResponse* response) {
  response->set_model_name(model.name);
  response->set_model_version(model.version);
  response->set_id(request.id());
  auto& params = *response->mutable_parameters();
  params["snapshot_id"].set_int64_param(
      static_cast<int64_t>(result.snapshot->id));
  params["snapshot_version"].set_int64_param(
      static_cast<int64_t>(result.snapshot->version_sum));
  params["snapshot_age_ms"].set_int64_param(
      absl::ToInt64Milliseconds(absl::Now() - result.snapshot->taken));
  params["batch_rows"].set_int64_param(result.batch_rows);
  ModelInferResponse::InferOutputTensor* out = response->add_outputs();
  out->set_name(model.output_name);
  out->set_datatype("FP32");
  out->add_shape(static_cast<int64_t>(result.out.size() / model.output_dim));
  out->add_shape(model.output_dim);
  if (raw) {
    response->add_raw_output_contents(
        reinterpret_cast<const char*>(result.out.data()),
        result.out.size() * sizeof(float));
  } else {
    out->mutable_contents()->mutable_fp32_contents()->Add(result.out.begin(),
                                                          result.out.end());
  }
}

ModelMetadataResponse ModelMetadata(const ModelSignature& model) {
  ModelMetadataResponse m;
  m.set_name(model.name);
  m.add_versions(model.version);
  m.set_platform(model.platform);
  if (model.input_dim > 0) {
    auto* in = m.add_inputs();
    in->set_name(model.input_name);
    in->set_datatype("FP32");
    in->add_shape(-1);
    in->add_shape(model.input_dim);
  }
  if (model.ids_per_row > 0) {
    auto* ids = m.add_inputs();
    ids->set_name(model.ids_name);
    ids->set_datatype("INT64");
    ids->add_shape(-1);
    ids->add_shape(model.ids_per_row);
  }
  auto* out = m.add_outputs();
  out->set_name(model.output_name);
  out->set_datatype("FP32");
  out->add_shape(-1);
  out->add_shape(model.output_dim);
  return m;
}

}  // namespace asyncps
