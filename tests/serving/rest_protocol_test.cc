// The REST form's parsing and encoding (serving/rest_protocol.h) and the
// content codings (serving/http_coding.h), in process: JSON bodies, the
// binary tensor data extension with every way its sizes can disagree, and
// answers compressed with zlib read back with zlib.

#include "serving/rest_protocol.h"

#include <zlib.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "serving/http_coding.h"
#include "tests/testing/require_ok.h"

namespace asyncps {
namespace {

std::string Floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()),
                     v.size() * sizeof(float));
}

std::string BinaryInput(const std::string& name, const char* datatype,
                        const std::string& shape, size_t bytes) {
  return absl::StrCat(R"({"name":")", name, R"(","datatype":")", datatype,
                      R"(","shape":)", shape,
                      R"(,"parameters":{"binary_data_size":)", bytes, "}}");
}

absl::StatusOr<RestInferRequest> Parse(const std::string& json,
                                       const std::string& binary,
                                       bool header = true) {
  return ParseRestInferRequest(
      json + binary, header ? std::to_string(json.size()) : "", "mlp");
}

TEST_CASE("a JSON body parses to contents, parameters and outputs", "[rest]") {
  auto r = ParseRestInferRequest(
      R"({"id":"a","parameters":{"timeout_ms":50},"inputs":[{"name":"input",
          "datatype":"FP32","shape":[2,2],"data":[[1,2],[3,4.5]]}],
          "outputs":[{"name":"probabilities"}]})",
      "", "mlp");
  REQUIRE_OK(r.status());
  REQUIRE(r->request.model_name() == "mlp");
  REQUIRE(r->request.id() == "a");
  REQUIRE(r->request.parameters().at("timeout_ms").int64_param() == 50);
  REQUIRE(r->request.raw_input_contents_size() == 0);
  const auto& v = r->request.inputs(0).contents().fp32_contents();
  REQUIRE(std::vector<float>(v.begin(), v.end()) ==
          std::vector<float>{1, 2, 3, 4.5f});
  REQUIRE_FALSE(r->outputs.Binary("probabilities"));
  REQUIRE(absl::StrContains(
      ParseRestInferRequest("{\"inputs\": [", "", "mlp").status().message(),
      "not a JSON object"));
}

TEST_CASE(
    "JSON nested deeper than 50 levels is refused before it is parsed; "
    "brackets in strings do not count",
    "[rest][bad_input]") {
  // data nested `rank` deep under {"inputs":[{ ... }]}: 3 + rank levels.
  const auto body = [](int rank, const std::string& id) {
    return absl::StrCat(R"({"id":")", id, R"(","inputs":[{"name":"input",)",
                        R"("datatype":"FP32","shape":[1],"data":)",
                        std::string(rank, '['), "1", std::string(rank, ']'),
                        "}]}");
  };
  // 50 levels: parsed (and refused for its shape, not its depth).
  absl::Status s = ParseRestInferRequest(body(47, ""), "", "mlp").status();
  REQUIRE_FALSE(absl::StrContains(s.message(), "deeper than"));
  s = ParseRestInferRequest(body(48, ""), "", "mlp").status();
  REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(absl::StrContains(s.message(), "deeper than 50 levels"));
  // The same brackets inside a string are text.
  const std::string text = std::string(200, '[') + "\\\"" + "{{";
  REQUIRE_OK(ParseRestInferRequest(body(1, text), "", "mlp").status());
  // 200,000 levels: refused at once (protobuf's parser would take minutes).
  s = ParseRestInferRequest(body(200000, ""), "", "mlp").status();
  REQUIRE(absl::StrContains(s.message(), "deeper than 50 levels"));
}

TEST_CASE("binary inputs mix with JSON ones, in input order", "[rest]") {
  const std::vector<float> x = {0.5f, -1.25f, 3e-8f, 7};
  const std::vector<int64_t> ids = {1LL << 60, 3};
  const std::string json = absl::StrCat(
      R"({"inputs":[)", BinaryInput("dense", "FP32", "[2,2]", 16),
      R"(,{"name":"ids","datatype":"INT64","shape":[2,1],"data":[5,6]},)",
      BinaryInput("big", "INT64", "[2]", 16),
      R"(],"parameters":{"binary_data_output":true}})");
  auto r = Parse(
      json,
      Floats(x) + std::string(reinterpret_cast<const char*>(ids.data()), 16));
  REQUIRE_OK(r.status());
  REQUIRE(r->request.raw_input_contents_size() == 3);
  REQUIRE(r->request.raw_input_contents(0) == Floats(x));
  std::vector<int64_t> json_ids(2);
  REQUIRE(r->request.raw_input_contents(1).size() == 16);
  std::memcpy(json_ids.data(), r->request.raw_input_contents(1).data(), 16);
  REQUIRE(json_ids == std::vector<int64_t>{5, 6});
  REQUIRE_FALSE(r->request.inputs(1).has_contents());
  std::vector<int64_t> big(2);
  std::memcpy(big.data(), r->request.raw_input_contents(2).data(), 16);
  REQUIRE(big == ids);
  REQUIRE(r->outputs.Binary("probabilities"));
}

TEST_CASE("inconsistent binary sizes are refused with a message", "[rest]") {
  const std::string four = Floats({1, 2, 3, 4});
  auto one = [](size_t declared) {
    return absl::StrCat(R"({"inputs":[)",
                        BinaryInput("input", "FP32", "[1,4]", declared), "]}");
  };
  const std::vector<std::pair<absl::StatusOr<RestInferRequest>, std::string>>
      cases = {
          // A size that disagrees with shape and datatype.
          {Parse(one(12), four.substr(0, 12)), "takes 16 bytes"},
          // Binary data shorter than declared: a truncated body.
          {Parse(one(16), four.substr(0, 10)), "truncated"},
          // Bytes after the last input's data.
          {Parse(one(16), four + "xy"), "2 bytes follow"},
          // Binary bytes with no binary input.
          {Parse(R"({"inputs":[{"name":"input","datatype":"FP32",
                      "shape":[1],"data":[1]}]})",
                 "zz"),
           "2 bytes follow"},
          // A declared binary input without the header length.
          {Parse(one(16), "", false), "truncated"},
          {Parse(absl::StrCat(R"({"inputs":[)",
                              BinaryInput("s", "BYTES", "[1]", 4), "]}"),
                 "abcd"),
           "not supported"},
          {Parse(absl::StrCat(R"({"inputs":[)",
                              BinaryInput("input", "FP32", "[-1,4]", 16), "]}"),
                 four),
           "not a size"},
          {Parse(R"({"inputs":[{"name":"input","datatype":"FP32","shape":[1],
                      "data":[1],"parameters":{"binary_data_size":4}}]})",
                 Floats({1})),
           "both 'data'"},
          {Parse(R"({"inputs":[{"name":"input","datatype":"FP32","shape":[1],
                      "parameters":{"binary_data_size":-4}}]})",
                 ""),
           ">= 0"},
          {Parse(absl::StrCat(R"({"inputs":[)",
                              BinaryInput("input", "FP32", "[1,4]", 16),
                              R"(],"parameters":{"binary_data_output":1}})"),
                 four),
           "true or false"},
      };
  for (const auto& [result, message] : cases) {
    INFO(message << ": " << result.status());
    REQUIRE(result.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(absl::StrContains(result.status().message(), message));
  }
  for (const char* length : {"abc", "-1", "999"}) {
    auto r = ParseRestInferRequest(one(16) + four, length, "mlp");
    INFO(length << ": " << r.status());
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(absl::StrContains(r.status().message(),
                              "Inference-Header-Content-Length"));
  }
}

inference::ModelInferResponse Answer(bool raw) {
  inference::ModelInferResponse response;
  response.set_model_name("mlp");
  response.set_model_version("1");
  (*response.mutable_parameters())["batch_rows"].set_int64_param(3);
  auto* out = response.add_outputs();
  out->set_name("probabilities");
  out->set_datatype("FP32");
  out->add_shape(1);
  out->add_shape(3);
  const std::vector<float> v = {0.1f, 1.0f / 3, 0.5666666f};
  if (raw) {
    response.add_raw_output_contents(Floats(v));
  } else {
    out->mutable_contents()->mutable_fp32_contents()->Add(v.begin(), v.end());
  }
  return response;
}

TEST_CASE("answers: binary outputs after the JSON, or JSON data", "[rest]") {
  for (bool raw : {false, true}) {
    RestOutputs binary;
    binary.named.emplace_back("probabilities", true);
    RestAnswer a = EncodeRestInferResponse(Answer(raw), binary);
    REQUIRE(a.has_binary);
    REQUIRE(a.body.size() == a.json_length + 12);
    REQUIRE(a.body.substr(a.json_length) ==
            Floats({0.1f, 1.0f / 3, 0.5666666f}));
    REQUIRE(absl::StrContains(a.body.substr(0, a.json_length),
                              "\"binary_data_size\":12"));
    REQUIRE_FALSE(
        absl::StrContains(a.body.substr(0, a.json_length), "data\":"));
    RestOutputs json;
    json.all_binary = true;
    json.named.emplace_back("probabilities", false);
    a = EncodeRestInferResponse(Answer(raw), json);
    REQUIRE_FALSE(a.has_binary);
    REQUIRE(a.json_length == a.body.size());
    REQUIRE(absl::StrContains(a.body, "\"data\":[0.1"));
  }
}

std::string Inflate(const std::string& in) {
  z_stream z{};
  REQUIRE(inflateInit2(&z, 32 + 15) == Z_OK);
  std::string out(1 << 16, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = in.size();
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = out.size();
  REQUIRE(inflate(&z, Z_FINISH) == Z_STREAM_END);
  out.resize(z.total_out);
  inflateEnd(&z);
  return out;
}

TEST_CASE("answer codings follow Accept-Encoding and read back", "[rest]") {
  REQUIRE(AnswerCoding("") == ContentCoding::kIdentity);
  REQUIRE(AnswerCoding("br") == ContentCoding::kIdentity);
  REQUIRE(AnswerCoding("deflate, gzip, br, zstd") == ContentCoding::kGzip);
  REQUIRE(AnswerCoding("gzip;q=0.5, deflate") == ContentCoding::kDeflate);
  REQUIRE(AnswerCoding("gzip;q=0, deflate;q=0") == ContentCoding::kIdentity);
  REQUIRE(AnswerCoding("*") == ContentCoding::kGzip);
  REQUIRE(AnswerCoding("gzip;q=0, *") == ContentCoding::kDeflate);
  REQUIRE(*RequestCoding("") == ContentCoding::kIdentity);
  REQUIRE(*RequestCoding("GZIP") == ContentCoding::kGzip);
  REQUIRE(*RequestCoding("deflate") == ContentCoding::kDeflate);
  REQUIRE(RequestCoding("br").status().code() ==
          absl::StatusCode::kUnimplemented);
  const std::string body(5000, 'x');
  for (ContentCoding c : {ContentCoding::kGzip, ContentCoding::kDeflate}) {
    absl::StatusOr<std::string> packed = Compress(body, c);
    REQUIRE_OK(packed.status());
    REQUIRE(packed->size() < 100);
    // gzip begins 1f 8b, the zlib format 78.
    REQUIRE(static_cast<unsigned char>((*packed)[0]) ==
            (c == ContentCoding::kGzip ? 0x1f : 0x78));
    REQUIRE(Inflate(*packed) == body);
  }
}

}  // namespace
}  // namespace asyncps
