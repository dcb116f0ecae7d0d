#include "serving/rest_protocol.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

// Raw tensor bytes are the host's values, copied as they are.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the binary tensor data extension is little-endian");

namespace asyncps {
namespace {

using google::protobuf::ListValue;
using google::protobuf::Struct;
using google::protobuf::Value;
using inference::InferParameter;
using inference::ModelInferRequest;
using inference::ModelInferResponse;
using inference::ModelMetadataResponse;
using ParameterMap = google::protobuf::Map<std::string, InferParameter>;

constexpr char kBinarySize[] = "binary_data_size";

absl::Status FlattenNumbers(const Value& v,
                            google::protobuf::RepeatedField<double>* out) {
  if (v.kind_case() == Value::kNumberValue) {
    out->Add(v.number_value());
    return absl::OkStatus();
  }
  if (v.kind_case() == Value::kListValue) {
    for (const Value& e : v.list_value().values()) {
      absl::Status s = FlattenNumbers(e, out);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError("input data must hold only numbers");
}

absl::Status ParameterFromJson(const Value& v, InferParameter* p) {
  switch (v.kind_case()) {
    case Value::kBoolValue:
      p->set_bool_param(v.bool_value());
      return absl::OkStatus();
    case Value::kStringValue:
      p->set_string_param(v.string_value());
      return absl::OkStatus();
    case Value::kNumberValue:
      if (v.number_value() == std::floor(v.number_value()) &&
          std::fabs(v.number_value()) < 9e15) {
        p->set_int64_param(static_cast<int64_t>(v.number_value()));
      } else {
        p->set_double_param(v.number_value());
      }
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          "a parameter must be a boolean, a number or a string");
  }
}

// The "parameters" object of `s` (request, input or output), if any.
absl::Status ParametersFromJson(const Struct& s, ParameterMap* out) {
  auto params = s.fields().find("parameters");
  if (params == s.fields().end()) return absl::OkStatus();
  if (params->second.kind_case() != Value::kStructValue) {
    return absl::InvalidArgumentError("'parameters' must be an object");
  }
  for (const auto& [key, value] : params->second.struct_value().fields()) {
    absl::Status s = ParameterFromJson(value, &(*out)[key]);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> StringField(const Struct& s, const char* name) {
  auto it = s.fields().find(name);
  if (it == s.fields().end()) return std::string();
  if (it->second.kind_case() != Value::kStringValue) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", name, "' must be a string"));
  }
  return it->second.string_value();
}

// JSON numbers `numbers` as the contents of `in` (by its datatype).
absl::Status ContentsFromNumbers(
    const google::protobuf::RepeatedField<double>& numbers,
    ModelInferRequest::InferInputTensor* in) {
  const std::string& datatype = in->datatype();
  if (datatype != "INT64" && datatype != "UINT64") {
    for (double v : numbers) {
      in->mutable_contents()->add_fp32_contents(static_cast<float>(v));
    }
    return absl::OkStatus();
  }
  // JSON numbers are doubles: ids up to 2^53 pass exactly.
  for (double v : numbers) {
    if (v != std::floor(v) || std::fabs(v) > 9007199254740992.0) {
      return absl::InvalidArgumentError(
          "INT64 data must be integers of magnitude up to 2^53 (use "
          "the binary form or gRPC for larger ids)");
    }
    if (datatype == "INT64") {
      in->mutable_contents()->add_int64_contents(static_cast<int64_t>(v));
    } else if (v < 0) {
      return absl::InvalidArgumentError("UINT64 data must be >= 0");
    } else {
      in->mutable_contents()->add_uint64_contents(static_cast<uint64_t>(v));
    }
  }
  return absl::OkStatus();
}

// One entry of "inputs": name, datatype, shape, parameters, and "data"
// unless its parameters give a binary_data_size (then not).
absl::Status InputFromJson(const Value& v,
                           ModelInferRequest::InferInputTensor* in) {
  if (v.kind_case() != Value::kStructValue) {
    return absl::InvalidArgumentError("every input must be an object");
  }
  const Struct& t = v.struct_value();
  absl::StatusOr<std::string> name = StringField(t, "name");
  absl::StatusOr<std::string> datatype = StringField(t, "datatype");
  if (!name.ok()) return name.status();
  if (!datatype.ok()) return datatype.status();
  in->set_name(*name);
  in->set_datatype(*datatype);
  auto shape = t.fields().find("shape");
  if (shape == t.fields().end() ||
      shape->second.kind_case() != Value::kListValue) {
    return absl::InvalidArgumentError("an input's 'shape' must be a list");
  }
  for (const Value& d : shape->second.list_value().values()) {
    if (d.kind_case() != Value::kNumberValue ||
        d.number_value() != std::floor(d.number_value()) ||
        std::fabs(d.number_value()) > 1e15) {
      return absl::InvalidArgumentError("shape entries must be integers");
    }
    in->add_shape(static_cast<int64_t>(d.number_value()));
  }
  absl::Status s = ParametersFromJson(t, in->mutable_parameters());
  if (!s.ok()) return s;
  const bool binary = in->parameters().count(kBinarySize) > 0;
  auto data = t.fields().find("data");
  if (binary) {
    if (data == t.fields().end()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "input '", *name, "' has both 'data' and a binary_data_size"));
  }
  if (data == t.fields().end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input '", *name, "' needs 'data' or a binary_data_size parameter"));
  }
  google::protobuf::RepeatedField<double> numbers;
  s = FlattenNumbers(data->second, &numbers);
  if (!s.ok()) return s;
  return ContentsFromNumbers(numbers, in);
}

// How deep a request's JSON may nest arrays and objects: as deep as
// protobuf's JSON parser takes into a google.protobuf.Struct (it refuses
// 51 levels), but a deeper body is refused before that parser runs, whose
// work grows with the square of the depth (a 200 KB body of 100,000
// nested lists held a core for minutes). A KServe body nests 3 levels plus
// its tensor's rank.
constexpr int kMaxJsonDepth = 50;

// Whether `json` nests arrays and objects deeper than `limit` (brackets in
// strings do not count). One pass, stopping at the first level too deep.
bool NestsDeeperThan(absl::string_view json, int limit) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

// The JSON header of a request.
absl::StatusOr<ModelInferRequest> RequestFromJson(
    absl::string_view json, const std::string& model_name) {
  if (NestsDeeperThan(json, kMaxJsonDepth)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the body nests JSON arrays and objects deeper than ", kMaxJsonDepth,
        " levels; a KServe request needs 3 plus its tensor's rank"));
  }
  Struct body;
  if (!google::protobuf::util::JsonStringToMessage(
           google::protobuf::StringPiece(json.data(), json.size()), &body)
           .ok()) {
    return absl::InvalidArgumentError(
        "the body is not a JSON object (expected {\"inputs\": [...]})");
  }
  ModelInferRequest request;
  request.set_model_name(model_name);
  absl::StatusOr<std::string> id = StringField(body, "id");
  if (!id.ok()) return id.status();
  request.set_id(*id);
  absl::Status s = ParametersFromJson(body, request.mutable_parameters());
  if (!s.ok()) return s;
  auto inputs = body.fields().find("inputs");
  if (inputs == body.fields().end() ||
      inputs->second.kind_case() != Value::kListValue) {
    return absl::InvalidArgumentError("'inputs' must be a list");
  }
  for (const Value& v : inputs->second.list_value().values()) {
    s = InputFromJson(v, request.add_inputs());
    if (!s.ok()) return s;
  }
  auto outputs = body.fields().find("outputs");
  if (outputs == body.fields().end()) return request;
  if (outputs->second.kind_case() != Value::kListValue) {
    return absl::InvalidArgumentError("'outputs' must be a list");
  }
  for (const Value& v : outputs->second.list_value().values()) {
    if (v.kind_case() != Value::kStructValue) {
      return absl::InvalidArgumentError("every output must be an object");
    }
    absl::StatusOr<std::string> name = StringField(v.struct_value(), "name");
    if (!name.ok()) return name.status();
    auto* out = request.add_outputs();
    out->set_name(*name);
    s = ParametersFromJson(v.struct_value(), out->mutable_parameters());
    if (!s.ok()) return s;
  }
  return request;
}

// Bytes of one value of `datatype` (0: not a fixed-size type).
size_t DatatypeBytes(const std::string& datatype) {
  if (datatype == "BOOL" || datatype == "INT8" || datatype == "UINT8") {
    return 1;
  }
  if (datatype == "INT16" || datatype == "UINT16" || datatype == "FP16" ||
      datatype == "BF16") {
    return 2;
  }
  if (datatype == "INT32" || datatype == "UINT32" || datatype == "FP32") {
    return 4;
  }
  if (datatype == "INT64" || datatype == "UINT64" || datatype == "FP64") {
    return 8;
  }
  return 0;
}

std::string ShapeText(const ModelInferRequest::InferInputTensor& in) {
  return absl::StrCat("[", absl::StrJoin(in.shape(), ", "), "]");
}

// The bytes `in` holds by its shape and datatype.
absl::StatusOr<uint64_t> TensorBytes(
    const ModelInferRequest::InferInputTensor& in) {
  const size_t width = DatatypeBytes(in.datatype());
  if (width == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("input '", in.name(), "': binary data of datatype '",
                     in.datatype(), "' is not supported"));
  }
  uint64_t bytes = width;
  for (int64_t d : in.shape()) {
    if (d < 0 ||
        __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input '", in.name(), "' shape ", ShapeText(in), " is not a size"));
    }
  }
  return bytes;
}

// The declared binary_data_size of `in` (-1 when it has JSON data).
absl::StatusOr<int64_t> BinarySize(
    const ModelInferRequest::InferInputTensor& in) {
  auto it = in.parameters().find(kBinarySize);
  if (it == in.parameters().end()) return -1;
  if (it->second.parameter_choice_case() != InferParameter::kInt64Param ||
      it->second.int64_param() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("input '", in.name(), "': ", kBinarySize,
                     " must be a whole number of bytes >= 0"));
  }
  return it->second.int64_param();
}

// The JSON contents of `in`, as raw bytes of its datatype.
absl::StatusOr<std::string> ContentsAsBytes(
    const ModelInferRequest::InferInputTensor& in) {
  auto bytes = [](const auto& values) {
    return std::string(reinterpret_cast<const char*>(values.data()),
                       values.size() * sizeof(values[0]));
  };
  if (in.datatype() == "FP32") return bytes(in.contents().fp32_contents());
  if (in.datatype() == "INT64") return bytes(in.contents().int64_contents());
  if (in.datatype() == "UINT64") return bytes(in.contents().uint64_contents());
  return absl::InvalidArgumentError(absl::StrCat(
      "input '", in.name(), "' datatype '", in.datatype(),
      "': JSON data mixes with binary inputs for FP32, INT64 and UINT64"));
}

// Splits `binary` (the bytes after the JSON header) among the inputs
// that declared a binary_data_size, in order, into raw_input_contents;
// JSON inputs of a mix are converted. Refuses sizes that disagree with
// shapes and datatypes, binary data shorter than declared, and leftovers.
absl::Status AttachBinaryInputs(absl::string_view binary,
                                ModelInferRequest* request) {
  std::vector<int64_t> sizes;
  bool any = false;
  for (const auto& in : request->inputs()) {
    absl::StatusOr<int64_t> size = BinarySize(in);
    if (!size.ok()) return size.status();
    any = any || *size >= 0;
    sizes.push_back(*size);
  }
  size_t offset = 0;
  for (int k = 0; any && k < request->inputs_size(); ++k) {
    auto* in = request->mutable_inputs(k);
    if (sizes[k] < 0) {
      absl::StatusOr<std::string> raw = ContentsAsBytes(*in);
      if (!raw.ok()) return raw.status();
      *request->add_raw_input_contents() = *std::move(raw);
      in->clear_contents();
      continue;
    }
    absl::StatusOr<uint64_t> want = TensorBytes(*in);
    if (!want.ok()) return want.status();
    const uint64_t size = static_cast<uint64_t>(sizes[k]);
    if (size != *want) {
      return absl::InvalidArgumentError(
          absl::StrCat("input '", in->name(), "' has ", kBinarySize, " ", size,
                       ", but its shape ", ShapeText(*in), " of ",
                       in->datatype(), " takes ", *want, " bytes"));
    }
    if (size > binary.size() - offset) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input '", in->name(), "' needs ", size, " bytes at offset ", offset,
          " of the binary data, which holds ", binary.size(),
          " bytes (a truncated body?)"));
    }
    request->add_raw_input_contents(binary.data() + offset, size);
    offset += size;
  }
  if (offset != binary.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        binary.size() - offset, " bytes follow the JSON header beyond the ",
        offset, " bytes of binary input data the inputs declare"));
  }
  return absl::OkStatus();
}

// binary_data_output and the outputs' binary_data, which must be booleans.
absl::StatusOr<RestOutputs> OutputForms(const ModelInferRequest& request) {
  auto flag = [](const ParameterMap& params, const char* key,
                 bool* out) -> absl::Status {
    auto it = params.find(key);
    if (it == params.end()) return absl::OkStatus();
    if (it->second.parameter_choice_case() != InferParameter::kBoolParam) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", key, " must be true or false"));
    }
    *out = it->second.bool_param();
    return absl::OkStatus();
  };
  RestOutputs forms;
  absl::Status s =
      flag(request.parameters(), "binary_data_output", &forms.all_binary);
  for (const auto& out : request.outputs()) {
    bool binary = forms.all_binary;
    if (s.ok()) s = flag(out.parameters(), "binary_data", &binary);
    forms.named.emplace_back(out.name(), binary);
  }
  if (!s.ok()) return s;
  return forms;
}

Value NumberValue(double d) {
  Value v;
  v.set_number_value(d);
  return v;
}

Value StringValue(const std::string& s) {
  Value v;
  v.set_string_value(s);
  return v;
}

std::string ToJson(const google::protobuf::Message& m) {
  std::string out;
  // Cannot fail for the Struct messages built here.
  (void)google::protobuf::util::MessageToJsonString(m, &out);
  return out;
}

// Output `i` of `response` as raw FP32 bytes.
std::string OutputBytes(const ModelInferResponse& response, int i) {
  if (i < response.raw_output_contents_size()) {
    return response.raw_output_contents(i);
  }
  const auto& v = response.outputs(i).contents().fp32_contents();
  return std::string(reinterpret_cast<const char*>(v.data()),
                     v.size() * sizeof(float));
}

}  // namespace

bool RestOutputs::Binary(const std::string& output) const {
  for (const auto& [name, binary] : named) {
    if (name == output) return binary;
  }
  return all_binary;
}

absl::StatusOr<RestInferRequest> ParseRestInferRequest(
    absl::string_view body, absl::string_view header_length,
    const std::string& model_name) {
  size_t json_length = body.size();
  if (!header_length.empty()) {
    uint64_t n = 0;
    if (!absl::SimpleAtoi(header_length, &n)) {
      return absl::InvalidArgumentError(
          absl::StrCat(kInferenceHeaderLength, " '", header_length,
                       "' is not a number of bytes"));
    }
    if (n > body.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(kInferenceHeaderLength, " ", n, " is beyond the body's ",
                       body.size(), " bytes (a truncated body?)"));
    }
    json_length = static_cast<size_t>(n);
  }
  RestInferRequest r;
  absl::StatusOr<ModelInferRequest> request =
      RequestFromJson(body.substr(0, json_length), model_name);
  if (!request.ok()) return request.status();
  r.request = *std::move(request);
  absl::Status s = AttachBinaryInputs(body.substr(json_length), &r.request);
  if (!s.ok()) return s;
  absl::StatusOr<RestOutputs> outputs = OutputForms(r.request);
  if (!outputs.ok()) return outputs.status();
  r.outputs = *std::move(outputs);
  return r;
}

RestAnswer EncodeRestInferResponse(const ModelInferResponse& response,
                                   const RestOutputs& forms) {
  Struct body;
  auto& f = *body.mutable_fields();
  f["model_name"] = StringValue(response.model_name());
  f["model_version"] = StringValue(response.model_version());
  if (!response.id().empty()) f["id"] = StringValue(response.id());
  Struct params;
  for (const auto& [key, p] : response.parameters()) {
    (*params.mutable_fields())[key] =
        NumberValue(static_cast<double>(p.int64_param()));
  }
  *f["parameters"].mutable_struct_value() = params;
  ListValue* outputs = f["outputs"].mutable_list_value();
  std::string binary;
  bool has_binary = false;
  for (int i = 0; i < response.outputs_size(); ++i) {
    const auto& out = response.outputs(i);
    Struct o;
    auto& of = *o.mutable_fields();
    of["name"] = StringValue(out.name());
    of["datatype"] = StringValue(out.datatype());
    ListValue* shape = of["shape"].mutable_list_value();
    for (int64_t d : out.shape()) *shape->add_values() = NumberValue(d);
    const std::string bytes = OutputBytes(response, i);
    if (forms.Binary(out.name())) {
      (*of["parameters"]
            .mutable_struct_value()
            ->mutable_fields())[kBinarySize] =
          NumberValue(static_cast<double>(bytes.size()));
      binary += bytes;
      has_binary = true;
    } else {
      ListValue* data = of["data"].mutable_list_value();
      for (size_t k = 0; k + sizeof(float) <= bytes.size();
           k += sizeof(float)) {
        float v;
        std::memcpy(&v, bytes.data() + k, sizeof(float));
        *data->add_values() = NumberValue(v);
      }
    }
    *outputs->add_values()->mutable_struct_value() = o;
  }
  RestAnswer answer;
  answer.body = ToJson(body);
  answer.json_length = answer.body.size();
  answer.has_binary = has_binary;
  answer.body += binary;
  return answer;
}

std::string ModelMetadataToJson(const ModelMetadataResponse& m) {
  Struct body;
  auto& f = *body.mutable_fields();
  f["name"] = StringValue(m.name());
  f["platform"] = StringValue(m.platform());
  ListValue* versions = f["versions"].mutable_list_value();
  for (const std::string& v : m.versions())
    *versions->add_values() = StringValue(v);
  auto tensors = [](const auto& list, ListValue* out) {
    for (const auto& t : list) {
      Struct o;
      auto& of = *o.mutable_fields();
      of["name"] = StringValue(t.name());
      of["datatype"] = StringValue(t.datatype());
      ListValue* shape = of["shape"].mutable_list_value();
      for (int64_t d : t.shape()) *shape->add_values() = NumberValue(d);
      *out->add_values()->mutable_struct_value() = o;
    }
  };
  tensors(m.inputs(), f["inputs"].mutable_list_value());
  tensors(m.outputs(), f["outputs"].mutable_list_value());
  return ToJson(body);
}

std::string ErrorJson(absl::string_view message) {
  Struct body;
  (*body.mutable_fields())["error"] = StringValue(std::string(message));
  return ToJson(body);
}

}  // namespace asyncps
