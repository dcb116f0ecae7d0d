// ps_serve as a process in front of real ps_server shards (separate
// processes on port 0): every RPC of inference.GRPCInferenceService through
// the stubs generated from the published definition, the REST form, bad
// requests answered alone, answers equal to the MLP computed locally on the
// same parameters, shards left unchanged, parameters that follow training,
// a shard restart, and serving a checkpoint with no shards.

#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <signal.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/ps_client.h"
#include "kernels/backend.h"
#include "models/ctr_model.h"
#include "models/mlp.h"
#include "proto/grpc_predict_v2.grpc.pb.h"
#include "tests/serving/serve_process.h"
#include "tests/testing/cluster_client.h"
#include "tests/testing/held_requests.h"
#include "tests/testing/raw_calls.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

using inference::GRPCInferenceService;
using inference::ModelInferRequest;
using inference::ModelInferResponse;
using testing::RunfilePath;
using testing::ServerProcess;
using testing::StartPsCluster;
using testing::StartPsServer;
using testing::Subprocess;
using testing::UniqueTmpPath;
using testing::WaitForPortFile;

const std::vector<int> kLayers = {4, 3, 2};

// The model's tensors with known values (SGD, rate 1: a gradient g moves a
// value by exactly -g).
std::vector<std::vector<float>> InitialValues() {
  std::vector<std::vector<float>> v;
  for (size_t l = 0; l + 1 < kLayers.size(); ++l) {
    std::vector<float> w(kLayers[l] * kLayers[l + 1]), b(kLayers[l + 1]);
    for (size_t i = 0; i < w.size(); ++i)
      w[i] = 0.1f * ((i * 7 + l) % 11) - 0.5f;
    for (size_t i = 0; i < b.size(); ++i) b[i] = 0.05f * i - 0.02f * l;
    v.push_back(w);
    v.push_back(b);
  }
  return v;
}

std::vector<std::string> Names() {
  std::vector<std::string> names;
  for (size_t l = 0; l + 1 < kLayers.size(); ++l) {
    names.push_back(absl::StrCat("fc", l, "/w"));
    names.push_back(absl::StrCat("fc", l, "/b"));
  }
  return names;
}

std::vector<TensorSpec> Specs() {
  std::vector<TensorSpec> specs;
  for (size_t l = 0; l + 1 < kLayers.size(); ++l) {
    for (bool bias : {false, true}) {
      TensorSpec s;
      s.set_name(absl::StrCat("fc", l, bias ? "/b" : "/w"));
      if (!bias) s.add_shape(kLayers[l]);
      s.add_shape(kLayers[l + 1]);
      s.set_init(INIT_VALUES);
      s.mutable_optimizer()->set_type(OPT_SGD);
      s.mutable_optimizer()->set_learning_rate(1.0f);
      s.set_slice_elems(4);
      specs.push_back(s);
    }
  }
  return specs;
}

// The probabilities the MLP gives for `x` with `params`, computed here.
std::vector<float> Expected(const std::vector<std::vector<float>>& params,
                            const std::vector<float>& x, int rows) {
  std::unique_ptr<Backend> backend = MakeCpuBackend();
  auto mlp = Mlp::Create(kLayers, 64, backend.get());
  REQUIRE_OK(mlp.status());
  std::vector<const float*> p;
  for (const auto& v : params) p.push_back(v.data());
  REQUIRE_OK((*mlp)->LoadParams(p));
  std::vector<float> out(rows * kLayers.back());
  REQUIRE_OK((*mlp)->Predict(x.data(), rows, out.data()));
  return out;
}

std::vector<float> Features(int rows, float seed) {
  std::vector<float> x(rows * kLayers[0]);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(seed + 0.37f * i);
  return x;
}

ModelInferRequest Request(const std::vector<float>& x, int rows,
                          bool raw = false) {
  ModelInferRequest r;
  r.set_model_name("mlp");
  r.set_id("req-1");
  auto* in = r.add_inputs();
  in->set_name("input");
  in->set_datatype("FP32");
  in->add_shape(rows);
  in->add_shape(kLayers[0]);
  if (raw) {
    r.add_raw_input_contents(reinterpret_cast<const char*>(x.data()),
                             x.size() * sizeof(float));
  } else {
    in->mutable_contents()->mutable_fp32_contents()->Add(x.begin(), x.end());
  }
  return r;
}

std::vector<float> Output(const ModelInferResponse& r) {
  REQUIRE(r.outputs_size() == 1);
  REQUIRE(r.outputs(0).name() == "probabilities");
  if (r.raw_output_contents_size() > 0) {
    std::vector<float> out(r.raw_output_contents(0).size() / sizeof(float));
    std::memcpy(out.data(), r.raw_output_contents(0).data(),
                out.size() * sizeof(float));
    return out;
  }
  const auto& v = r.outputs(0).contents().fp32_contents();
  return std::vector<float>(v.begin(), v.end());
}

void RequireNear(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i)
    REQUIRE(a[i] == Approx(b[i]).margin(1e-6));
}

std::unique_ptr<grpc::ClientContext> Context() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  return ctx;
}

grpc::Status Infer(ServeProcess& s, const ModelInferRequest& r,
                   ModelInferResponse* out) {
  return s.stub->ModelInfer(Context().get(), r, out);
}

std::unique_ptr<PsClient> CreateModel(const std::vector<ServerProcess>& cluster,
                                      std::vector<std::vector<float>>* values) {
  auto worker = testing::ClusterClient(cluster);
  REQUIRE_OK(worker->WaitForShards(absl::Seconds(30)));
  REQUIRE_OK(worker->Register().status());
  *values = InitialValues();
  std::vector<std::pair<std::string, const float*>> init;
  const std::vector<std::string> names = Names();
  for (size_t i = 0; i < names.size(); ++i) {
    init.emplace_back(names[i], (*values)[i].data());
  }
  REQUIRE_OK(worker->CreateTensors(Specs(), init));
  return worker;
}

// Pushes gradient `g` to every element (values move by -g) and applies it
// to `values`.
void PushAll(PsClient* worker, int64_t clock, float g,
             std::vector<std::vector<float>>* values) {
  const std::vector<std::string> names = Names();
  std::vector<std::vector<float>> pulled = *values;
  std::vector<std::pair<std::string, float*>> outs;
  for (size_t i = 0; i < names.size(); ++i) {
    outs.emplace_back(names[i], pulled[i].data());
  }
  REQUIRE_OK(worker->Pull(clock, outs));
  std::vector<std::vector<float>> grads;
  std::vector<std::pair<std::string, const float*>> gs;
  for (size_t i = 0; i < names.size(); ++i) {
    grads.emplace_back((*values)[i].size(), g);
  }
  for (size_t i = 0; i < names.size(); ++i) {
    gs.emplace_back(names[i], grads[i].data());
    for (float& v : (*values)[i]) v -= g;
  }
  REQUIRE_OK(worker->Push(clock, gs).status());
}

int64_t SnapshotVersion(const ModelInferResponse& r) {
  return r.parameters().at("snapshot_version").int64_param();
}

TEST_CASE("ps_serve refuses bad batching flags, exit 2 naming the flag",
          "[ps_serve]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--blas_threads=-1", "--blas_threads must be in [0, 256]"},
      {"--blas_threads=257", "--blas_threads must be in [0, 256]"},
      {"--batch_threads=0", "--batch_threads must be in [1, 256]"},
      {"--max_batch_size=0", "--max_batch_size must be in [1, 65536]"},
      {"--max_queue=0", "--max_queue must be >= 1"},
  };
  for (const auto& [flag, message] : cases) {
    const std::string log = UniqueTmpPath("ps_serve_flags") + ".log";
    auto proc = Subprocess::Start(RunfilePath("serving/ps_serve"),
                                  {"--checkpoint_dir=/nonexistent", flag}, log);
    REQUIRE_OK(proc.status());
    absl::StatusOr<int> code = (*proc)->Wait(absl::Seconds(30));
    REQUIRE_OK(code.status());
    std::ifstream in(log);
    const std::string text((std::istreambuf_iterator<char>(in)),
                           std::istreambuf_iterator<char>());
    INFO(flag << ": " << text);
    CHECK(*code == 2);
    CHECK(absl::StrContains(text, message));
  }
}

TEST_CASE("ps_serve answers every KServe v2 RPC, over gRPC and REST",
          "[serving]") {
  auto cluster = StartPsCluster(2);
  REQUIRE_OK(cluster.status());
  std::vector<std::vector<float>> values;
  auto worker = CreateModel(*cluster, &values);
  ServeProcess serve = StartServe({"--servers=" + testing::ServerList(*cluster),
                                   "--refresh_s=0.2", "--batch_timeout_us=2000",
                                   "--max_batch_size=8", "--max_queue=64",
                                   "--max_request_bytes=65536"});

  inference::ServerLiveResponse live;
  REQUIRE(serve.stub->ServerLive(Context().get(), {}, &live).ok());
  REQUIRE(live.live());
  inference::ServerReadyResponse ready;
  REQUIRE(serve.stub->ServerReady(Context().get(), {}, &ready).ok());
  REQUIRE(ready.ready());
  inference::ModelReadyRequest model_ready;
  model_ready.set_name("mlp");
  inference::ModelReadyResponse model_ready_response;
  REQUIRE(serve.stub
              ->ModelReady(Context().get(), model_ready, &model_ready_response)
              .ok());
  REQUIRE(model_ready_response.ready());
  model_ready.set_name("resnet");
  REQUIRE(serve.stub
              ->ModelReady(Context().get(), model_ready, &model_ready_response)
              .error_code() == grpc::NOT_FOUND);
  inference::ServerMetadataResponse server_meta;
  REQUIRE(serve.stub->ServerMetadata(Context().get(), {}, &server_meta).ok());
  REQUIRE(server_meta.name() == "asyncps");
  REQUIRE(!server_meta.version().empty());
  inference::ModelMetadataRequest meta_request;
  meta_request.set_name("mlp");
  inference::ModelMetadataResponse meta;
  REQUIRE(serve.stub->ModelMetadata(Context().get(), meta_request, &meta).ok());
  REQUIRE(meta.inputs_size() == 1);
  REQUIRE(meta.inputs(0).name() == "input");
  REQUIRE(meta.inputs(0).datatype() == "FP32");
  REQUIRE(std::vector<int64_t>(meta.inputs(0).shape().begin(),
                               meta.inputs(0).shape().end()) ==
          std::vector<int64_t>{-1, 4});
  REQUIRE(std::vector<int64_t>(meta.outputs(0).shape().begin(),
                               meta.outputs(0).shape().end()) ==
          std::vector<int64_t>{-1, 2});

  // Answers equal the MLP computed here, in contents and raw form.
  const std::vector<float> x = Features(3, 0.5f);
  const std::vector<float> expected = Expected(values, x, 3);
  ModelInferResponse response;
  REQUIRE(Infer(serve, Request(x, 3), &response).ok());
  REQUIRE(response.id() == "req-1");
  REQUIRE(response.model_name() == "mlp");
  REQUIRE(std::vector<int64_t>(response.outputs(0).shape().begin(),
                               response.outputs(0).shape().end()) ==
          std::vector<int64_t>{3, 2});
  RequireNear(Output(response), expected);
  REQUIRE(SnapshotVersion(response) == 0);
  REQUIRE(response.parameters().at("snapshot_id").int64_param() >= 1);
  ModelInferResponse raw;
  REQUIRE(Infer(serve, Request(x, 3, true), &raw).ok());
  REQUIRE(raw.raw_output_contents_size() == 1);
  RequireNear(Output(raw), expected);

  // Bad requests: each refused with its reason.
  ModelInferRequest bad = Request(x, 3);
  bad.mutable_inputs(0)->set_datatype("INT64");
  grpc::Status s = Infer(serve, bad, &response);
  REQUIRE(s.error_code() == grpc::INVALID_ARGUMENT);
  REQUIRE(absl::StrContains(s.error_message(), "datatype"));
  bad = Request(x, 3);
  bad.mutable_inputs(0)->set_shape(1, 5);
  REQUIRE(Infer(serve, bad, &response).error_code() == grpc::INVALID_ARGUMENT);
  std::vector<float> nan = x;
  nan[5] = std::nanf("");
  s = Infer(serve, Request(nan, 3), &response);
  REQUIRE(s.error_code() == grpc::INVALID_ARGUMENT);
  REQUIRE(absl::StrContains(s.error_message(), "row 1"));
  REQUIRE(Infer(serve, Request(Features(9, 1), 9), &response).error_code() ==
          grpc::INVALID_ARGUMENT);
  bad = Request(x, 3);
  bad.set_model_name("resnet");
  REQUIRE(Infer(serve, bad, &response).error_code() == grpc::NOT_FOUND);
  bad = Request(x, 3);
  bad.add_raw_input_contents("xx");
  REQUIRE(Infer(serve, bad, &response).error_code() == grpc::INVALID_ARGUMENT);
  bad = Request(x, 3);
  bad.mutable_inputs(0)->mutable_contents()->add_fp32_contents(1);
  REQUIRE(Infer(serve, bad, &response).error_code() == grpc::INVALID_ARGUMENT);
  bad = Request(x, 3);
  bad.set_id(std::string(100000, 'x'));  // over --max_request_bytes
  REQUIRE(Infer(serve, bad, &response).error_code() ==
          grpc::RESOURCE_EXHAUSTED);
  bad = Request(x, 3);
  (*bad.mutable_parameters())["timeout_ms"].set_string_param("soon");
  REQUIRE(Infer(serve, bad, &response).error_code() == grpc::INVALID_ARGUMENT);
  // Bytes that do not parse as a ModelInferRequest (field 3 announced as
  // 1000 bytes long, followed by 3): INVALID_ARGUMENT naming the method,
  // not gRPC's INTERNAL.
  s = testing::RawUnary(
      grpc::CreateChannel(serve.address, grpc::InsecureChannelCredentials()),
      "/inference.GRPCInferenceService/ModelInfer",
      std::string("\x1a\xe8\x07"
                  "abc",
                  6));
  REQUIRE(s.error_code() == grpc::INVALID_ARGUMENT);
  REQUIRE(absl::StrContains(s.error_message(), "does not parse"));

  // Requests in flight together, good and bad: the bad ones are refused
  // alone, the good ones batched and equal to their unbatched answers.
  constexpr int kThreads = 12;
  std::vector<std::thread> threads;
  std::vector<grpc::Status> statuses(kThreads);
  std::vector<ModelInferResponse> answers(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<float> xt = Features(1, t);
      if (t % 4 == 3) xt[0] = INFINITY;
      statuses[t] = Infer(serve, Request(xt, 1), &answers[t]);
    });
  }
  for (std::thread& t : threads) t.join();
  int64_t largest_batch = 0;
  for (int t = 0; t < kThreads; ++t) {
    if (t % 4 == 3) {
      REQUIRE(statuses[t].error_code() == grpc::INVALID_ARGUMENT);
      continue;
    }
    REQUIRE(statuses[t].ok());
    RequireNear(Output(answers[t]), Expected(values, Features(1, t), 1));
    largest_batch = std::max(
        largest_batch, answers[t].parameters().at("batch_rows").int64_param());
  }
  REQUIRE(largest_batch > 1);

  // REST.
  httplib::Client http("127.0.0.1", serve.http_port);
  http.set_read_timeout(20);
  auto health = http.Get("/v2/health/ready");
  REQUIRE(health);
  REQUIRE(health->status == 200);
  std::vector<std::string> rows;
  for (int r = 0; r < 3; ++r) {
    std::vector<std::string> v;
    for (int i = 0; i < 4; ++i) v.push_back(absl::StrCat(x[r * 4 + i]));
    rows.push_back(absl::StrCat("[", absl::StrJoin(v, ","), "]"));
  }
  const std::string body = absl::StrCat(
      R"({"id":"r7","inputs":[{"name":"input","shape":[3,4],"datatype":"FP32","data":[)",
      absl::StrJoin(rows, ","), "]}]}");
  auto infer = http.Post("/v2/models/mlp/infer", body, "application/json");
  REQUIRE(infer);
  REQUIRE(infer->status == 200);
  REQUIRE(absl::StrContains(infer->body, "\"id\":\"r7\""));
  REQUIRE(absl::StrContains(infer->body, "\"probabilities\""));
  const size_t data = infer->body.find("\"data\":[");
  REQUIRE(data != std::string::npos);
  std::vector<float> rest_out;
  for (absl::string_view v : absl::StrSplit(
           absl::string_view(infer->body)
               .substr(data + 8, infer->body.find(']', data) - data - 8),
           ',')) {
    float f = 0;
    REQUIRE(absl::SimpleAtof(v, &f));
    rest_out.push_back(f);
  }
  RequireNear(rest_out, expected);
  auto malformed =
      http.Post("/v2/models/mlp/infer", "{\"inputs\": [", "application/json");
  REQUIRE(malformed);
  REQUIRE(malformed->status == 400);
  REQUIRE(absl::StrContains(malformed->body, "\"error\""));
  // A body over --max_request_bytes (65536) is refused before it is read.
  auto huge = http.Post("/v2/models/mlp/infer", std::string(100000, ' '),
                        "application/json");
  REQUIRE(huge);
  REQUIRE(huge->status == 413);
  auto unknown = http.Post("/v2/models/resnet/infer", body, "application/json");
  REQUIRE(unknown);
  REQUIRE(unknown->status == 404);
  auto metadata = http.Get("/v2/models/mlp");
  REQUIRE(metadata);
  REQUIRE(metadata->status == 200);
  REQUIRE(absl::StrContains(metadata->body, "\"input\""));
  auto metrics = http.Get("/metrics");
  REQUIRE(metrics);
  REQUIRE(absl::StrContains(metrics->body,
                            "asyncps_serve_requests_total{outcome=\"ok\"} 12"));
  // 8 refused bad gRPC requests, one whose bytes do not parse, 3 concurrent
  // ones, malformed JSON and an unknown model over REST (the oversized ones
  // never reach ps_serve's code).
  REQUIRE(absl::StrContains(
      metrics->body, "asyncps_serve_requests_total{outcome=\"invalid\"} 14"));
  REQUIRE(absl::StrContains(metrics->body, "asyncps_serve_batch_rows_count"));
  REQUIRE(absl::StrContains(metrics->body, "asyncps_serve_ready 1"));
  auto status = http.Get("/status");
  REQUIRE(status);
  REQUIRE(absl::StartsWith(status->body, "ready model mlp snapshot"));

  // The shards saw one worker (the creator) and no rows: serving changed
  // nothing there.
  absl::StatusOr<std::vector<StatusResponse>> shards = worker->Status();
  REQUIRE_OK(shards.status());
  for (const StatusResponse& st : *shards) {
    REQUIRE(st.workers_size() == 1);
    REQUIRE(st.workers(0).worker_id() == 0);
    REQUIRE(st.workers(0).clock() == 0);
  }
  REQUIRE_OK(serve.process->Signal(SIGTERM));
  absl::StatusOr<int> code = serve.process->Wait(absl::Seconds(20));
  REQUIRE_OK(code.status());
  REQUIRE(*code == 0);
}

// Waits until ps_serve answers with parameters of at least `version`
// updates, and returns that answer.
ModelInferResponse AwaitVersion(ServeProcess& serve,
                                const std::vector<float>& x, int64_t version) {
  ModelInferResponse response;
  const absl::Time until = absl::Now() + absl::Seconds(30);
  for (;;) {
    response.Clear();
    REQUIRE(Infer(serve, Request(x, 2), &response).ok());
    if (SnapshotVersion(response) >= version) return response;
    REQUIRE(absl::Now() < until);
    absl::SleepFor(absl::Milliseconds(50));
  }
  // Last (metrics above count the refusals): random bytes and random
  // protobuf wire data on every method never get an answer that reads as a
  // bug or a missing method, nor crash ps_serve.
  {
    testing::RandomWire input(612);
    auto channel =
        grpc::CreateChannel(serve.address, grpc::InsecureChannelCredentials());
    for (const char* method :
         {"ServerLive", "ServerReady", "ModelReady", "ServerMetadata",
          "ModelMetadata", "ModelInfer"}) {
      for (int i = 0; i < 60; ++i) {
        const grpc::Status r = testing::RawUnary(
            channel, absl::StrCat("/inference.GRPCInferenceService/", method),
            input.Next());
        INFO(method << " input " << i << ": " << r.error_code() << " "
                    << r.error_message());
        REQUIRE(r.error_code() != grpc::UNKNOWN);
        REQUIRE(r.error_code() != grpc::INTERNAL);
        REQUIRE(r.error_code() != grpc::UNIMPLEMENTED);
        REQUIRE(r.error_code() != grpc::DEADLINE_EXCEEDED);
      }
    }
    REQUIRE(serve.process->Running());
    REQUIRE(serve.process->Running());
  }
}

TEST_CASE(
    "calls whose requests never finish hold at most --max_unfinished_bytes; "
    "inference goes on",
    "[serving][bad_input]") {
  auto cluster = StartPsCluster(2);
  REQUIRE_OK(cluster.status());
  std::vector<std::vector<float>> values;
  auto worker = CreateModel(*cluster, &values);
  ServeProcess serve = StartServe({"--servers=" + testing::ServerList(*cluster),
                                   "--max_request_bytes=16777216",
                                   "--max_unfinished_bytes=67108864"});
  const pid_t pid = serve.process->pid();
  const int64_t before = testing::ReadProcessResources(pid)->peak_rss_bytes;
  // 256 ModelInfer calls announcing 16 MiB each, never finished: gRPC
  // holds what they send before any check (1.8 GB in 8 s before the
  // bound, from 4 connections of 200 such calls).
  testing::HeldRequestOptions held;
  held.port = std::stoi(serve.address.substr(serve.address.rfind(':') + 1));
  held.connections = 4;
  held.streams = 64;
  held.path = "/inference.GRPCInferenceService/ModelInfer";
  held.declared_bytes = 16 << 20;
  held.max_bytes = int64_t{1} << 30;
  held.hold = absl::Seconds(4);
  absl::StatusOr<testing::HeldRequestResult> result =
      testing::HoldRequests(held);
  REQUIRE_OK(result.status());
  const int64_t after = testing::ReadProcessResources(pid)->peak_rss_bytes;
  INFO("sent " << result->sent_bytes / (1 << 20) << " MiB, connections closed "
               << result->closed << "; peak RSS " << before / (1 << 20)
               << " -> " << after / (1 << 20) << " MiB");
  CHECK(result->closed == held.connections);
  CHECK(after - before < (160 << 20));  // the 64 MiB budget and more
  const std::vector<float> x = Features(2, 1.0f);
  ModelInferResponse r;
  REQUIRE(Infer(serve, Request(x, 2), &r).ok());
  RequireNear(Output(r), Expected(values, x, 2));
}

TEST_CASE(
    "requests that would parse into far more memory than their size are "
    "refused on every KServe method before parsing",
    "[serving][bad_input]") {
  auto cluster = StartPsCluster(2);
  REQUIRE_OK(cluster.status());
  std::vector<std::vector<float>> values;
  auto worker = CreateModel(*cluster, &values);
  // The default --max_request_bytes (64 MiB).
  ServeProcess serve =
      StartServe({"--servers=" + testing::ServerList(*cluster)});
  auto channel =
      grpc::CreateChannel(serve.address, grpc::InsecureChannelCredentials());
  // 32 MiB of empty unknown fields to each method: gRPC's typed parse of
  // such requests took the process to gigabytes.
  const std::string flood = testing::EmptyUnknownFields(32 << 20);
  const pid_t pid = serve.process->pid();
  const int64_t before = testing::ReadProcessResources(pid)->peak_rss_bytes;
  for (const char* method : {"ServerLive", "ServerReady", "ModelReady",
                             "ServerMetadata", "ModelMetadata", "ModelInfer"}) {
    const grpc::Status r = testing::RawUnary(
        channel, absl::StrCat("/inference.GRPCInferenceService/", method),
        flood, 60);
    INFO(method << ": " << r.error_message());
    CHECK(r.error_code() == grpc::RESOURCE_EXHAUSTED);
    CHECK(r.error_message().find("parsing it would take more than") !=
          std::string::npos);
  }
  const int64_t after = testing::ReadProcessResources(pid)->peak_rss_bytes;
  INFO("peak RSS " << before / 1e6 << " MB -> " << after / 1e6 << " MB");
  CHECK(after - before < (400 << 20));
  inference::ServerLiveResponse live;
  REQUIRE(serve.stub->ServerLive(Context().get(), {}, &live).ok());
  CHECK(live.live());
}

TEST_CASE(
    "served parameters follow training, survive a shard restart and are "
    "served from the checkpoint without shards",
    "[serving]") {
  const std::string dir = testing::MakeTmpDir("serve_ckpt");
  const std::vector<std::string> shard_flags = {"--checkpoint_dir=" + dir};
  auto cluster = StartPsCluster(2, shard_flags);
  REQUIRE_OK(cluster.status());
  std::vector<std::vector<float>> values;
  auto worker = CreateModel(*cluster, &values);
  ServeProcess serve = StartServe({"--servers=" + testing::ServerList(*cluster),
                                   "--refresh_s=0.1", "--rpc_timeout_ms=500"});
  const std::vector<float> x = Features(2, 2.0f);
  // 4 tensors of 12, 3, 6, 2 elements in slices of 4: 3 + 1 + 2 + 1 slices.
  constexpr int64_t kSlices = 7;

  PushAll(worker.get(), 0, 0.25f, &values);
  ModelInferResponse r = AwaitVersion(serve, x, kSlices);
  REQUIRE(SnapshotVersion(r) == kSlices);
  RequireNear(Output(r), Expected(values, x, 2));

  // Shard 1 stops (writing its checkpoint): answers go on from the last
  // snapshot, whose age grows.
  const int port1 = std::stoi((*cluster)[1].address.substr(10));
  REQUIRE_OK((*cluster)[1].process->Signal(SIGTERM));
  REQUIRE_OK((*cluster)[1].process->Wait(absl::Seconds(20)).status());
  absl::SleepFor(absl::Milliseconds(1500));
  ModelInferResponse stale;
  REQUIRE(Infer(serve, Request(x, 2), &stale).ok());
  REQUIRE(SnapshotVersion(stale) == kSlices);
  REQUIRE(stale.parameters().at("snapshot_age_ms").int64_param() >= 1000);
  RequireNear(Output(stale), Output(r));
  httplib::Client http("127.0.0.1", serve.http_port);
  auto metrics = http.Get("/metrics");
  REQUIRE(metrics);
  REQUIRE(!absl::StrContains(metrics->body,
                             "asyncps_serve_refresh_failures_total 0\n"));

  // Back on its port, restored: the next push is served.
  auto back = StartPsServer(1, 2, shard_flags, absl::Seconds(30), port1);
  REQUIRE_OK(back.status());
  (*cluster)[1] = *std::move(back);
  PushAll(worker.get(), 1, -0.5f, &values);
  r = AwaitVersion(serve, x, 2 * kSlices);
  REQUIRE(SnapshotVersion(r) == 2 * kSlices);
  RequireNear(Output(r), Expected(values, x, 2));
  REQUIRE(r.parameters().at("snapshot_age_ms").int64_param() < 1000);

  // The cluster stops (final checkpoints); the checkpoint is served alone.
  cluster->clear();
  ServeProcess offline = StartServe({"--checkpoint_dir=" + dir});
  ModelInferResponse from_checkpoint;
  REQUIRE(Infer(offline, Request(x, 2), &from_checkpoint).ok());
  REQUIRE(SnapshotVersion(from_checkpoint) == 2 * kSlices);
  RequireNear(Output(from_checkpoint), Expected(values, x, 2));
  httplib::Client offline_http("127.0.0.1", offline.http_port);
  auto line = offline_http.Get("/status");
  REQUIRE(line);
  REQUIRE(absl::StrContains(line->body, "from checkpoint " + dir));
}

TEST_CASE("ps_serve follows the checkpoints of a run in progress",
          "[serving]") {
  const std::string dir = testing::MakeTmpDir("serve_follow");
  auto cluster =
      StartPsCluster(2, {"--checkpoint_dir=" + dir, "--checkpoint_every_s=1"});
  REQUIRE_OK(cluster.status());
  std::vector<std::vector<float>> values;
  auto worker = CreateModel(*cluster, &values);
  const std::vector<std::vector<float>> initial = values;
  // Only the spec files so far (created, never pushed): initial values.
  ServeProcess serve =
      StartServe({"--checkpoint_dir=" + dir, "--refresh_s=0.1"});
  const std::vector<float> x = Features(2, 2.0f);
  ModelInferResponse first;
  REQUIRE(Infer(serve, Request(x, 2), &first).ok());
  RequireNear(Output(first), Expected(initial, x, 2));
  constexpr int64_t kSlices = 7;  // as above

  // Each push reaches the server once the shards checkpointed it.
  PushAll(worker.get(), 0, 0.25f, &values);
  ModelInferResponse r = AwaitVersion(serve, x, kSlices);
  REQUIRE(SnapshotVersion(r) == kSlices);
  RequireNear(Output(r), Expected(values, x, 2));
  PushAll(worker.get(), 1, -0.5f, &values);
  r = AwaitVersion(serve, x, 2 * kSlices);
  REQUIRE(SnapshotVersion(r) == 2 * kSlices);
  RequireNear(Output(r), Expected(values, x, 2));
  httplib::Client http("127.0.0.1", serve.http_port);
  auto metrics = http.Get("/metrics");
  REQUIRE(metrics);
  CHECK(absl::StrContains(metrics->body,
                          "asyncps_serve_refresh_failures_total 0\n"));
}

TEST_CASE(
    "answers streaming while the parameters change name the snapshot "
    "they were computed with",
    "[serving]") {
  auto cluster = StartPsCluster(2);
  REQUIRE_OK(cluster.status());
  std::vector<std::vector<float>> values;
  auto worker = CreateModel(*cluster, &values);
  ServeProcess serve =
      StartServe({"--servers=" + testing::ServerList(*cluster),
                  "--refresh_s=0.01", "--batch_timeout_us=300"});
  // Push k moves every value by -0.1 * k in total: a snapshot whose version
  // is 7k (all 7 slices at k pushes) holds exactly initial - 0.1 k.
  constexpr int64_t kSlices = 7;
  constexpr int kPushes = 12;
  std::vector<std::vector<std::vector<float>>> after(kPushes + 1);
  after[0] = values;
  std::atomic<bool> pushing{true};
  std::thread pusher([&] {
    for (int k = 1; k <= kPushes; ++k) {
      PushAll(worker.get(), k - 1, 0.1f, &values);
      after[k] = values;
      absl::SleepFor(absl::Milliseconds(40));
    }
    pushing = false;
  });
  const std::vector<float> x = Features(2, 7.0f);
  std::vector<std::pair<int64_t, std::vector<float>>> answers;
  while (pushing.load()) {
    std::vector<std::thread> callers;
    std::vector<ModelInferResponse> got(4);
    std::vector<grpc::Status> st(4);
    for (int c = 0; c < 4; ++c) {
      callers.emplace_back(
          [&, c] { st[c] = Infer(serve, Request(x, 2), &got[c]); });
    }
    for (std::thread& t : callers) t.join();
    for (int c = 0; c < 4; ++c) {
      REQUIRE(st[c].ok());
      answers.emplace_back(SnapshotVersion(got[c]), Output(got[c]));
    }
  }
  pusher.join();
  int checked = 0;
  std::set<int64_t> versions;
  for (const auto& [version, out] : answers) {
    versions.insert(version);
    if (version % kSlices != 0) continue;  // read while a push landed
    RequireNear(out, Expected(after[version / kSlices], x, 2));
    ++checked;
  }
  REQUIRE(versions.size() >= 3);  // the parameters did change meanwhile
  REQUIRE(checked >= 10);
}

// The click model: dense weights and embedding tables on the shards, rows
// read per batch without creating any, from live shards and a checkpoint.
TEST_CASE("ps_serve serves the click model's embedding rows and weights",
          "[serving]") {
  const std::string dir = testing::MakeTmpDir("serve_ctr");
  auto cluster = StartPsCluster(2, {"--checkpoint_dir=" + dir});
  REQUIRE_OK(cluster.status());
  auto worker = testing::ClusterClient(*cluster);
  REQUIRE_OK(worker->WaitForShards(absl::Seconds(30)));
  REQUIRE_OK(worker->Register().status());
  CtrModelConfig config;
  config.fields = 2;
  config.dense_features = 2;
  config.embedding_dim = 3;
  config.hidden = {4};
  std::unique_ptr<Backend> backend = MakeCpuBackend();
  auto model = CtrModel::Create(config, 16, backend.get());
  REQUIRE_OK(model.status());
  OptimizerSpec sgd;
  sgd.set_type(OPT_SGD);
  sgd.set_learning_rate(1.0f);
  REQUIRE_OK(worker->CreateTensors(CtrDenseSpecs(**model, sgd, 5)));
  std::vector<TableSpec> tables;
  for (int f = 0; f < config.fields; ++f) {
    TableSpec t;
    t.set_name(CtrTableName(f));
    t.set_dim(config.embedding_dim);
    t.set_init(INIT_UNIFORM);
    t.set_init_value(0.5f);
    t.set_seed(f + 1);
    *t.mutable_optimizer() = sgd;
    tables.push_back(t);
  }
  REQUIRE_OK(worker->CreateTables(tables));
  // Rows 7 and 9 of field 0 and row 7 of field 1 are trained once.
  const std::vector<uint64_t> trained0 = {7, 9}, trained1 = {7};
  const std::vector<float> g0(6, 0.25f), g1(3, -0.5f);
  std::vector<float> scratch(6);
  auto pulled = worker->StartPullRows(
      0, 0, {{CtrTableName(0), trained0, scratch.data()}});
  REQUIRE_OK(pulled->Wait());
  auto pulled1 = worker->StartPullRows(
      0, 0, {{CtrTableName(1), trained1, scratch.data()}});
  REQUIRE_OK(pulled1->Wait());
  ReadSet read = pulled->read();
  read.tables[CtrTableName(1)] = pulled1->read().tables.at(CtrTableName(1));
  REQUIRE_OK(worker
                 ->StartPushRows(0,
                                 {{CtrTableName(0), trained0, g0.data()},
                                  {CtrTableName(1), trained1, g1.data()}},
                                 read)
                 ->Wait()
                 .status());

  // Three rows: trained ids and ids never seen (initial values).
  const std::vector<uint64_t> ids = {7, 7, 9, 1234, 5555, 7};  // rows x fields
  const std::vector<float> dense = {0.5f, -1.0f, 2.0f, 0.25f, -0.3f, 0.8f};
  auto expected = [&]() {
    std::vector<std::vector<float>> params;
    std::vector<std::pair<std::string, float*>> outs;
    const std::vector<std::string> names = {"ctr/fc0/w", "ctr/fc0/b",
                                            "ctr/fc1/w", "ctr/fc1/b"};
    for (const ParamInfo& p : (*model)->params()) {
      params.emplace_back(p.num_elements());
    }
    for (size_t i = 0; i < names.size(); ++i) {
      REQUIRE(names[i] == (*model)->params()[i].name);
      outs.emplace_back(names[i], params[i].data());
    }
    REQUIRE_OK(worker->Pull(1, outs));
    std::vector<float> emb(2 * 3 * 3);
    for (int f = 0; f < 2; ++f) {
      const std::vector<uint64_t> col = {ids[f], ids[2 + f], ids[4 + f]};
      auto p = worker->StartPullRows(
          1, 1, {{CtrTableName(f), col, emb.data() + f * 9, /*peek=*/true}});
      REQUIRE_OK(p->Wait());
    }
    std::vector<const float*> ptrs;
    for (const auto& v : params) ptrs.push_back(v.data());
    std::vector<float> prob(3);
    REQUIRE_OK(
        (*model)->Predict(ptrs, emb.data(), dense.data(), 3, prob.data()));
    return prob;
  }();
  auto request = [&]() {
    ModelInferRequest r;
    r.set_model_name("ctr");
    auto* d = r.add_inputs();
    d->set_name("dense");
    d->set_datatype("FP32");
    d->add_shape(3);
    d->add_shape(2);
    d->mutable_contents()->mutable_fp32_contents()->Add(dense.begin(),
                                                        dense.end());
    auto* i = r.add_inputs();
    i->set_name("ids");
    i->set_datatype("INT64");
    i->add_shape(3);
    i->add_shape(2);
    for (uint64_t id : ids) i->mutable_contents()->add_int64_contents(id);
    return r;
  };
  auto rows_held = [&]() {
    absl::StatusOr<std::vector<StatusResponse>> st = worker->Status();
    REQUIRE_OK(st.status());
    uint64_t n = 0;
    for (const StatusResponse& s : *st) {
      for (const TableStatus& t : s.tables()) n += t.rows();
    }
    return n;
  };
  const uint64_t before = rows_held();
  REQUIRE(before == 3);

  {
    ServeProcess serve = StartServe(
        {"--servers=" + testing::ServerList(*cluster), "--model=ctr"});
    inference::ModelMetadataRequest meta_request;
    meta_request.set_name("ctr");
    inference::ModelMetadataResponse meta;
    REQUIRE(
        serve.stub->ModelMetadata(Context().get(), meta_request, &meta).ok());
    REQUIRE(meta.inputs_size() == 2);
    REQUIRE(meta.inputs(0).name() == "dense");
    REQUIRE(meta.inputs(1).name() == "ids");
    REQUIRE(meta.inputs(1).datatype() == "INT64");
    REQUIRE(meta.outputs(0).name() == "click_probability");
    ModelInferResponse response;
    REQUIRE(Infer(serve, request(), &response).ok());
    RequireNear(std::vector<float>(
                    response.outputs(0).contents().fp32_contents().begin(),
                    response.outputs(0).contents().fp32_contents().end()),
                expected);
    // Twice: the second answer comes from the hot-row cache.
    ModelInferResponse again;
    REQUIRE(Infer(serve, request(), &again).ok());
    REQUIRE(again.outputs(0).contents().fp32_contents(1) ==
            response.outputs(0).contents().fp32_contents(1));
    REQUIRE(rows_held() == before);  // nothing created by serving

    ModelInferRequest bad = request();
    bad.mutable_inputs()->RemoveLast();
    REQUIRE(Infer(serve, bad, &response).error_code() ==
            grpc::INVALID_ARGUMENT);
    bad = request();
    bad.mutable_inputs(1)->set_datatype("FP32");
    REQUIRE(Infer(serve, bad, &response).error_code() ==
            grpc::INVALID_ARGUMENT);
    bad = request();
    bad.mutable_inputs(1)->set_shape(0, 2);
    REQUIRE(Infer(serve, bad, &response).error_code() ==
            grpc::INVALID_ARGUMENT);

    httplib::Client http("127.0.0.1", serve.http_port);
    auto rest = http.Post(
        "/v2/models/ctr/infer",
        R"({"inputs":[{"name":"ids","datatype":"INT64","shape":[3,2],"data":[[7,7],[9,1234],[5555,7]]},)"
        R"({"name":"dense","datatype":"FP32","shape":[3,2],"data":[0.5,-1,2,0.25,-0.3,0.8]}]})",
        "application/json");
    REQUIRE(rest);
    REQUIRE(rest->status == 200);
    REQUIRE(absl::StrContains(rest->body, "\"click_probability\""));
  }

  // From the checkpoint, with no shards.
  cluster->clear();
  ServeProcess offline = StartServe({"--checkpoint_dir=" + dir, "--model=ctr"});
  ModelInferResponse from_checkpoint;
  REQUIRE(Infer(offline, request(), &from_checkpoint).ok());
  RequireNear(std::vector<float>(
                  from_checkpoint.outputs(0).contents().fp32_contents().begin(),
                  from_checkpoint.outputs(0).contents().fp32_contents().end()),
              expected);
}

}  // namespace
}  // namespace asyncps
