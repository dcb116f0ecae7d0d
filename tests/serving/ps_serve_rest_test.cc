// ps_serve's REST form as real clients send it, through real HTTP against a
// ps_serve process in front of a real ps_server shard serving a
// 784-16-10 MLP: a real Fashion-MNIST image with curl -d (a form
// Content-Type), --data-binary with application/json, gzip and deflate
// bodies, --compressed answers, the binary tensor data extension; every
// answer equal to the gRPC answer bit for bit. Then, over raw sockets,
// malformed extension headers, sizes that disagree with shapes, a gzip
// bomb and a truncated body, sent among good requests that batch: each
// refused with its status and nothing computed, the good ones answered.

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <zlib.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/ps_client.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "proto/grpc_predict_v2.grpc.pb.h"
#include "tests/serving/serve_process.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

using inference::GRPCInferenceService;
using inference::ModelInferRequest;
using inference::ModelInferResponse;
using testing::RunfilePath;
using testing::Subprocess;
using testing::UniqueTmpPath;
using testing::WaitForPortFile;

const std::vector<int> kLayers = {784, 16, 10};

// Creates the MLP's tensors on `cluster` with fixed values.
void CreateModel(const std::vector<testing::ServerProcess>& cluster) {
  PsClientOptions o;
  for (const auto& s : cluster) o.servers.push_back(s.address);
  o.retry.call_deadline = absl::Seconds(30);
  auto worker = PsClient::Connect(o);
  REQUIRE_OK(worker.status());
  REQUIRE_OK((*worker)->WaitForShards(absl::Seconds(30)));
  REQUIRE_OK((*worker)->Register().status());
  std::vector<TensorSpec> specs;
  std::vector<std::vector<float>> values;
  for (size_t l = 0; l + 1 < kLayers.size(); ++l) {
    for (bool bias : {false, true}) {
      TensorSpec s;
      s.set_name(absl::StrCat("fc", l, bias ? "/b" : "/w"));
      if (!bias) s.add_shape(kLayers[l]);
      s.add_shape(kLayers[l + 1]);
      s.set_init(INIT_VALUES);
      s.mutable_optimizer()->set_type(OPT_SGD);
      s.mutable_optimizer()->set_learning_rate(0.1f);
      s.set_slice_elems(1024);
      std::vector<float> v(bias ? kLayers[l + 1] : kLayers[l] * kLayers[l + 1]);
      for (size_t i = 0; i < v.size(); ++i) {
        v[i] = 0.01f * static_cast<float>((i * 37 + l * 11) % 23) - 0.1f;
      }
      specs.push_back(s);
      values.push_back(std::move(v));
    }
  }
  std::vector<std::pair<std::string, const float*>> init;
  for (size_t i = 0; i < specs.size(); ++i) {
    init.emplace_back(specs[i].name(), values[i].data());
  }
  REQUIRE_OK((*worker)->CreateTensors(specs, init));
}

// Fashion-MNIST test images `first` .. `first + n - 1`, pixels / 255 as
// doubles.
std::vector<double> Images(int first, int n) {
  gzFile f = gzopen(
      "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz", "rb");
  REQUIRE(f != nullptr);
  std::vector<unsigned char> bytes(16 + 784 * (first + n));
  const int got = gzread(f, bytes.data(), bytes.size());
  gzclose(f);
  REQUIRE(got == static_cast<int>(bytes.size()));
  std::vector<double> x;
  for (size_t i = 16 + 784 * first; i < bytes.size(); ++i) {
    x.push_back(bytes[i] / 255.0);
  }
  return x;
}

std::vector<float> AsFloats(const std::vector<double>& x) {
  return std::vector<float>(x.begin(), x.end());
}

std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()),
                     v.size() * sizeof(float));
}

// README's request: the values as a JSON client prints doubles.
std::string JsonBody(const std::vector<double>& x, int rows) {
  std::vector<std::string> v;
  for (double d : x) v.push_back(absl::StrFormat("%.17g", d));
  return absl::StrCat(
      R"({"inputs":[{"name":"input","datatype":"FP32","shape":[)", rows,
      R"(,784],"data":[)", absl::StrJoin(v, ","), "]}]}");
}

// {json header, its length} of a binary request for `rows` rows.
std::pair<std::string, size_t> BinaryBody(const std::vector<float>& x, int rows,
                                          bool binary_output) {
  std::string json = absl::StrCat(
      R"({"inputs":[{"name":"input","datatype":"FP32","shape":[)", rows,
      R"(,784],"parameters":{"binary_data_size":)", x.size() * 4, "}}]",
      binary_output ? R"(,"parameters":{"binary_data_output":true})" : "", "}");
  const size_t length = json.size();
  return {json + Bytes(x), length};
}

// The gRPC answer's output bytes for the same floats ("" when it failed).
// Runs on any thread (no assertions).
std::string TryGrpcOutput(ServeProcess& serve, const std::vector<float>& x,
                          int rows) {
  ModelInferRequest r;
  r.set_model_name("mlp");
  auto* in = r.add_inputs();
  in->set_name("input");
  in->set_datatype("FP32");
  in->add_shape(rows);
  in->add_shape(784);
  in->mutable_contents()->mutable_fp32_contents()->Add(x.begin(), x.end());
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  ModelInferResponse response;
  grpc::Status s = serve.stub->ModelInfer(&ctx, r, &response);
  if (!s.ok() || response.outputs_size() != 1) return "";
  const auto& v = response.outputs(0).contents().fp32_contents();
  return Bytes(std::vector<float>(v.begin(), v.end()));
}

std::string GrpcOutput(ServeProcess& serve, const std::vector<float>& x,
                       int rows) {
  std::string out = TryGrpcOutput(serve, x, rows);
  REQUIRE(!out.empty());
  return out;
}

// Outputs (float32 bytes) that agree to rounding: a row computed within a
// batch of several is summed in another order than alone (the BLAS kernel
// blocks by the batch's size on some CPUs), so it may differ in its last
// bits, never more.
void RequireSameToRounding(const std::string& got, const std::string& want) {
  REQUIRE(got.size() == want.size());
  std::vector<float> g(got.size() / sizeof(float));
  std::vector<float> w(g.size());
  std::memcpy(g.data(), got.data(), got.size());
  std::memcpy(w.data(), want.data(), want.size());
  for (size_t i = 0; i < g.size(); ++i) {
    INFO("output " << i);
    REQUIRE(g[i] == Approx(w[i]).epsilon(1e-5).margin(1e-6));
  }
}

// The FP32 "data" of a JSON answer's first output, as bytes.
std::string JsonOutput(const std::string& body) {
  google::protobuf::Struct answer;
  REQUIRE(google::protobuf::util::JsonStringToMessage(body, &answer).ok());
  const auto& out =
      answer.fields().at("outputs").list_value().values(0).struct_value();
  std::vector<float> v;
  for (const auto& d : out.fields().at("data").list_value().values()) {
    v.push_back(static_cast<float>(d.number_value()));
  }
  return Bytes(v);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
}

struct CurlResult {
  int status = 0;
  std::string headers;
  std::string body;
};

// Runs curl (20 s at most) on the infer URL with `args`.
CurlResult Curl(const ServeProcess& serve,
                const std::vector<std::string>& args) {
  const std::string stem = UniqueTmpPath("curl");
  std::vector<std::string> all = {
      "-s",
      "-S",
      "-m",
      "20",
      "-o",
      stem + ".body",
      "-D",
      stem + ".headers",
      "-w",
      "%{http_code}",
      absl::StrCat("http://127.0.0.1:", serve.http_port,
                   "/v2/models/mlp/infer")};
  all.insert(all.end(), args.begin(), args.end());
  auto proc = Subprocess::Start("/usr/bin/curl", all, stem + ".out");
  REQUIRE_OK(proc.status());
  absl::StatusOr<int> code = (*proc)->Wait(absl::Seconds(30));
  REQUIRE_OK(code.status());
  const std::string out = (*proc)->ReadLog();
  INFO(out);
  REQUIRE(*code == 0);
  CurlResult r;
  REQUIRE(absl::SimpleAtoi(out.substr(out.size() - 3), &r.status));
  r.headers = ReadFile(stem + ".headers");
  r.body = ReadFile(stem + ".body");
  return r;
}

std::string WriteTmp(const std::string& contents) {
  const std::string path = UniqueTmpPath("body");
  std::ofstream(path, std::ios::binary) << contents;
  return path;
}

// `data` compressed by zlib: gzip when `gzip`, else the zlib format.
std::string Deflate(const std::string& data, bool gzip) {
  z_stream z{};
  REQUIRE(deflateInit2(&z, 9, Z_DEFLATED, gzip ? 31 : 15, 9,
                       Z_DEFAULT_STRATEGY) == Z_OK);
  std::string out(deflateBound(&z, data.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = data.size();
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = out.size();
  REQUIRE(deflate(&z, Z_FINISH) == Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

TEST_CASE("every REST form curl sends answers as gRPC does, bit for bit",
          "[rest]") {
  auto cluster = testing::StartPsCluster(1);
  REQUIRE_OK(cluster.status());
  CreateModel(*cluster);
  ServeProcess serve = StartServe({"--servers=" + testing::ServerList(*cluster),
                                   "--refresh_s=60", "--batch_timeout_us=0"});
  // Images 1 and 2 (a pullover, a trouser): image 0 is mostly background.
  const std::vector<double> image = Images(1, 2);
  const std::vector<double> one(image.begin(), image.begin() + 784);
  const std::string expected1 = GrpcOutput(serve, AsFloats(one), 1);
  const std::string expected2 = GrpcOutput(serve, AsFloats(image), 2);

  // README's example with a real image: curl -d, a form Content-Type.
  const std::string json = JsonBody(one, 1);
  REQUIRE(json.size() > 8192);  // the HTTP layer's cap for form bodies
  const std::string json_file = WriteTmp(json);
  CurlResult r = Curl(serve, {"-d", "@" + json_file});
  INFO(r.body);
  REQUIRE(r.status == 200);
  REQUIRE(JsonOutput(r.body) == expected1);
  r = Curl(serve, {"--data-binary", "@" + json_file, "-H",
                   "Content-Type: application/json"});
  REQUIRE(r.status == 200);
  REQUIRE(JsonOutput(r.body) == expected1);
  // --compressed: the answer is gzip, curl inflates it.
  r = Curl(serve, {"-d", "@" + json_file, "--compressed"});
  REQUIRE(r.status == 200);
  REQUIRE(absl::StrContains(absl::AsciiStrToLower(r.headers),
                            "content-encoding: gzip"));
  REQUIRE(JsonOutput(r.body) == expected1);
  // gzip and deflate request bodies, two rows.
  const std::string two = JsonBody(image, 2);
  for (bool gzip : {true, false}) {
    r = Curl(serve,
             {"--data-binary", "@" + WriteTmp(Deflate(two, gzip)), "-H",
              gzip ? "Content-Encoding: gzip" : "Content-Encoding: deflate"});
    REQUIRE(r.status == 200);
    REQUIRE(JsonOutput(r.body) == expected2);
  }

  // The binary extension, with binary and with JSON outputs.
  for (bool binary_output : {true, false}) {
    auto [body, length] = BinaryBody(AsFloats(image), 2, binary_output);
    r = Curl(serve, {"--data-binary", "@" + WriteTmp(body), "-H",
                     absl::StrCat("Inference-Header-Content-Length: ", length),
                     "-H", "Content-Type: application/octet-stream"});
    REQUIRE(r.status == 200);
    if (!binary_output) {
      REQUIRE(JsonOutput(r.body) == expected2);
      continue;
    }
    const size_t at = r.headers.find("Inference-Header-Content-Length: ");
    REQUIRE(at != std::string::npos);
    size_t json_length = 0;
    REQUIRE(absl::SimpleAtoi(
        r.headers.substr(at + 33, r.headers.find('\r', at) - at - 33),
        &json_length));
    REQUIRE(absl::StrContains(r.body.substr(0, json_length),
                              "\"binary_data_size\":80"));
    REQUIRE(r.body.substr(json_length) == expected2);
  }
  // Binary and compressed both ways.
  auto [body, length] = BinaryBody(AsFloats(one), 1, true);
  r = Curl(serve, {"--data-binary", "@" + WriteTmp(Deflate(body, true)), "-H",
                   "Content-Encoding: gzip", "-H",
                   absl::StrCat("Inference-Header-Content-Length: ", length),
                   "--compressed"});
  REQUIRE(r.status == 200);
  REQUIRE(r.body.substr(r.body.size() - 40) == expected1);
  REQUIRE_OK(serve.process->Kill().status());
}

// Sends `head` (request line and headers, without the blank line) and
// `body` on a new connection and returns the answer's status and body
// (read until the server closes, 20 s at most). The connection stays open
// for writing: the HTTP layer drops half-closed connections unanswered. Runs on
// any thread (no assertions).
std::pair<int, std::string> RawHttp(int port, const std::string& head,
                                    const std::string& body) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  timeval tv{20, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  const std::string request = head + "\r\nConnection: close\r\n\r\n" + body;
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n =
        send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server may answer and close before the end
    sent += n;
  }
  std::string answer;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;)
    answer.append(buf, n);
  close(fd);
  int status = 0;  // 0: no HTTP answer
  if (answer.size() < 12 || !absl::SimpleAtoi(answer.substr(9, 3), &status)) {
    return {0, answer};
  }
  const size_t at = answer.find("\r\n\r\n");
  return {status, at == std::string::npos ? "" : answer.substr(at + 4)};
}

std::string InferHead(size_t content_length, const std::string& extra) {
  return absl::StrCat("POST /v2/models/mlp/infer HTTP/1.1\r\nHost: ps_serve",
                      "\r\nContent-Length: ", content_length, extra);
}

int64_t Metric(const std::string& metrics, const std::string& name) {
  const size_t at = metrics.find("\n" + name + " ");
  REQUIRE(at != std::string::npos);
  const size_t from = at + name.size() + 2;
  double v = 0;
  REQUIRE(absl::SimpleAtod(
      metrics.substr(from, metrics.find('\n', from) - from), &v));
  return static_cast<int64_t>(v);
}

TEST_CASE(
    "bad REST bodies are refused with their status among good requests that "
    "batch; nothing is computed for them",
    "[rest]") {
  auto cluster = testing::StartPsCluster(1);
  REQUIRE_OK(cluster.status());
  CreateModel(*cluster);
  constexpr int kLimit = 1 << 20;
  ServeProcess serve = StartServe(
      {"--servers=" + testing::ServerList(*cluster), "--refresh_s=60",
       "--batch_timeout_us=100000", "--max_batch_size=64",
       absl::StrCat("--max_request_bytes=", kLimit), "--http_connections=16"});
  const std::vector<float> x = AsFloats(Images(1, 1));
  const std::string expected = GrpcOutput(serve, x, 1);
  auto [good, length] = BinaryBody(x, 1, true);
  const std::string header =
      R"({"inputs":[{"name":"input","datatype":"FP32",)"
      R"("shape":[1,784],"parameters":{"binary_data_size":)";
  const std::string ok_json = header + "3136}}]}";
  const std::string short_json = header + "3132}}]}";
  const std::string deep_list = std::string(400000, '[');
  const std::string deep_data = absl::StrCat(
      R"({"inputs":[{"name":"input","datatype":"FP32","shape":[1,784],)",
      R"("data":)", std::string(100000, '['), "1", std::string(100000, ']'),
      "}]}");
  std::string chunked;  // 48 MiB in 1 MiB chunks: no length up front
  for (int i = 0; i < 48; ++i) {
    absl::StrAppend(&chunked, "100000\r\n", std::string(1 << 20, 'x'), "\r\n");
  }
  chunked += "0\r\n\r\n";
  const std::string bomb = Deflate(std::string(100 << 20, '\0'), true);
  REQUIRE(bomb.size() < kLimit);
  struct Bad {
    std::string head, body;
    int status;
    std::string message;
  };
  const std::string len = "\r\nInference-Header-Content-Length: ";
  const std::vector<Bad> bad = {
      {InferHead(good.size(), len + "abc"), good, 400, "not a number"},
      {InferHead(good.size(), len + "999999"), good, 400, "beyond the body"},
      {InferHead(good.size() + 4, absl::StrCat(len, length)), good + "tail",
       400, "4 bytes follow"},
      {InferHead(short_json.size() + 3132,
                 absl::StrCat(len, short_json.size())),
       short_json + Bytes(x).substr(0, 3132), 400, "takes 3136 bytes"},
      {InferHead(ok_json.size() + 3000, absl::StrCat(len, ok_json.size())),
       ok_json + Bytes(x).substr(0, 3000), 400, "truncated"},
      // Content-Length promises more than is sent: the read of the body
      // times out (the HTTP layer's 5 s) and the request is refused.
      {InferHead(good.size(), absl::StrCat(len, length)),
       good.substr(0, good.size() / 2), 400, "could not be read"},
      {InferHead(bomb.size(), "\r\nContent-Encoding: gzip"), bomb, 413,
       absl::StrCat(kLimit)},
      {InferHead(kLimit + 1, ""), std::string(kLimit + 1, '{'), 413,
       absl::StrCat(kLimit)},
      {InferHead(9, "\r\nContent-Encoding: gzip"), "not gzip!", 400,
       "not valid gzip"},
      // The HTTP layer checks the limit before reading only against
      // Content-Length and would read a chunked body whole: refused first.
      {"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: ps_serve\r\n"
       "Transfer-Encoding: chunked",
       chunked, 411, "Content-Length"},
      // JSON nested deeper than any parser's stack: refused, no crash.
      {InferHead(deep_list.size(), ""), deep_list, 400, "deeper than 50"},
      {InferHead(deep_data.size(), ""), deep_data, 400, "deeper than 50"},
  };
  const absl::StatusOr<testing::ProcessResources> before =
      testing::ReadProcessResources(serve.process->pid());
  REQUIRE_OK(before.status());
  constexpr int kGood = 8;
  std::vector<std::string> answers(kGood);
  std::vector<std::pair<int, std::string>> refusals(bad.size());
  std::vector<std::thread> threads;
  for (int t = 0; t < kGood; ++t) {
    threads.emplace_back([&, t] { answers[t] = TryGrpcOutput(serve, x, 1); });
  }
  for (size_t b = 0; b < bad.size(); ++b) {
    threads.emplace_back([&, b] {
      refusals[b] = RawHttp(serve.http_port, bad[b].head, bad[b].body);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::string& a : answers) RequireSameToRounding(a, expected);
  for (size_t b = 0; b < bad.size(); ++b) {
    INFO(b << ": " << refusals[b].second);
    REQUIRE(refusals[b].first == bad[b].status);
    REQUIRE(absl::StrContains(refusals[b].second, bad[b].message));
  }
  // The bomb was not inflated whole: 100 MiB would show.
  const absl::StatusOr<testing::ProcessResources> after =
      testing::ReadProcessResources(serve.process->pid());
  REQUIRE_OK(after.status());
  REQUIRE(after->rss_bytes - before->rss_bytes < (40 << 20));
  // A good request on a raw socket still answers.
  auto [status, body] = RawHttp(
      serve.http_port, InferHead(good.size(), absl::StrCat(len, length)), good);
  REQUIRE(status == 200);
  REQUIRE(body.substr(body.size() - 40) == expected);

  // Computed: the 1 + kGood gRPC rows and the last one; the refused
  // bodies that got as far as decoding counted as invalid.
  CurlResult m = Curl(serve, {});  // a GET of the infer URL: 404
  REQUIRE(m.status == 404);
  const std::string metrics_stem = UniqueTmpPath("metrics");
  auto proc = Subprocess::Start(
      "/usr/bin/curl",
      {"-s", "-m", "20",
       absl::StrCat("http://127.0.0.1:", serve.http_port, "/metrics")},
      metrics_stem + ".out");
  REQUIRE_OK(proc.status());
  REQUIRE_OK((*proc)->Wait(absl::Seconds(30)).status());
  const std::string metrics = "\n" + (*proc)->ReadLog();
  REQUIRE(Metric(metrics, "asyncps_serve_batch_rows_sum") == kGood + 2);
  REQUIRE(Metric(metrics, "asyncps_serve_requests_total{outcome=\"ok\"}") ==
          kGood + 2);
  REQUIRE(Metric(metrics,
                 "asyncps_serve_requests_total{outcome=\"invalid\"}") == 7);
  REQUIRE(Metric(metrics, "asyncps_serve_batch_rows_count") < kGood + 2);
  REQUIRE_OK(serve.process->Kill().status());
}

}  // namespace
}  // namespace asyncps
