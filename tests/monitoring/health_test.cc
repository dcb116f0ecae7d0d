// A real ps_server answers the standard gRPC health check (SERVING while
// up) and lists its services through server reflection.

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/net.h"
#include "google/protobuf/descriptor.pb.h"
#include "proto/asyncps.grpc.pb.h"
#include "proto/grpc_health_v1.grpc.pb.h"
#include "proto/grpc_reflection_v1.grpc.pb.h"
#include "proto/grpc_reflection_v1alpha.grpc.pb.h"
#include "tests/testing/raw_calls.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;
using testing::ServerProcess;

constexpr absl::Duration kDeadline = absl::Seconds(20);

grpc::Status Check(Health::Stub* stub, const std::string& service,
                   HealthCheckResponse* resp) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + kDeadline));
  HealthCheckRequest req;
  req.set_service(service);
  return stub->Check(&ctx, req, resp);
}

TEST_CASE("a running shard reports SERVING to grpc.health.v1.Health/Check",
          "[monitoring][health]") {
  absl::StatusOr<ServerProcess> server =
      testing::StartPsServer(0, 1, {"--log_level=warn"});
  REQUIRE(server.ok());
  INFO("server log:\n" << server->process->LogTail());
  auto stub = Health::NewStub(MakeChannel(server->address));

  HealthCheckResponse resp;
  const grpc::Status s = Check(stub.get(), "", &resp);
  INFO(s.error_code() << ": " << s.error_message());
  REQUIRE(s.ok());
  CHECK(resp.status() == HealthCheckResponse::SERVING);

  // The service's own name answers too (probes that name it).
  HealthCheckResponse own;
  REQUIRE(Check(stub.get(), "asyncps.ParameterServer", &own).ok());
  CHECK(own.status() == HealthCheckResponse::SERVING);

  // A service the server never heard of is NOT_FOUND, per the protocol.
  HealthCheckResponse unknown;
  CHECK(Check(stub.get(), "no.such.Service", &unknown).error_code() ==
        grpc::StatusCode::NOT_FOUND);

  // Once the shard is gone the probe fails instead of reporting SERVING.
  REQUIRE(server->process->Kill(absl::Seconds(10)).ok());
  HealthCheckResponse after;
  CHECK_FALSE(Check(stub.get(), "", &after).ok());
}

TEST_CASE("server reflection lists asyncps.ParameterServer",
          "[monitoring][reflection]") {
  namespace refl = grpc::reflection::v1alpha;
  absl::StatusOr<ServerProcess> server =
      testing::StartPsServer(0, 1, {"--log_level=warn"});
  REQUIRE(server.ok());
  INFO("server log:\n" << server->process->LogTail());
  auto stub = refl::ServerReflection::NewStub(MakeChannel(server->address));

  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + kDeadline));
  auto stream = stub->ServerReflectionInfo(&ctx);
  refl::ServerReflectionRequest req;
  req.set_list_services("*");
  REQUIRE(stream->Write(req));
  REQUIRE(stream->WritesDone());
  refl::ServerReflectionResponse resp;
  REQUIRE(stream->Read(&resp));
  const grpc::Status s = stream->Finish();
  INFO(s.error_code() << ": " << s.error_message());
  REQUIRE(s.ok());
  INFO(resp.DebugString());
  REQUIRE(resp.has_list_services_response());
  std::set<std::string> services;
  for (const auto& svc : resp.list_services_response().service()) {
    services.insert(svc.name());
  }
  CHECK(services.count("asyncps.ParameterServer") == 1);
  CHECK(services.count("grpc.reflection.v1alpha.ServerReflection") == 1);
}

int ReadPort(const std::string& path) {
  std::ifstream in(path);
  int port = 0;
  in >> port;
  return port;
}

TEST_CASE(
    "--health_port serves only the health service, plain TCP, and goes "
    "NOT_SERVING before the shard stops",
    "[monitoring][health]") {
  const std::string file = testing::UniqueTmpPath("health_port");
  absl::StatusOr<ServerProcess> server = testing::StartPsServer(
      0, 1,
      {"--log_level=info", "--health_port=0", "--health_port_file=" + file});
  REQUIRE(server.ok());
  INFO("server log:\n" << server->process->LogTail());
  const int port = ReadPort(file);
  REQUIRE(port > 0);
  const std::string address = absl::StrCat("127.0.0.1:", port);
  auto stub = Health::NewStub(MakeChannel(address));
  for (const std::string service :
       {"", "asyncps.ParameterServer", "asyncps.Process"}) {
    HealthCheckResponse resp;
    REQUIRE(Check(stub.get(), service, &resp).ok());
    CHECK(resp.status() == HealthCheckResponse::SERVING);
  }
  // The parameter service is not on that port.
  auto ps = ParameterServer::NewStub(MakeChannel(address));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + kDeadline));
  StatusRequest req;
  StatusResponse resp;
  CHECK(ps->Status(&ctx, req, &resp).error_code() ==
        grpc::StatusCode::UNIMPLEMENTED);
  REQUIRE(server->process->Kill(absl::Seconds(10)).ok());
  HealthCheckResponse after;
  CHECK_FALSE(Check(stub.get(), "", &after).ok());
}

TEST_CASE(
    "--health_port answers NOT_SERVING while the shard restores a large "
    "checkpoint, then SERVING",
    "[monitoring][health]") {
  const std::string dir = testing::MakeTmpDir("health_restore");
  {
    // A shard with a 192 MiB tensor writes its final checkpoint on SIGTERM.
    absl::StatusOr<ServerProcess> first = testing::StartPsServer(
        0, 1, {"--log_level=warn", "--checkpoint_dir=" + dir});
    REQUIRE(first.ok());
    auto ps = ParameterServer::NewStub(MakeChannel(first->address));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + kDeadline));
    CreateTensorRequest create;
    TensorSpec* t = create.add_tensors();
    t->set_name("big");
    t->add_shape(48 << 20);
    t->set_init(INIT_CONSTANT);
    t->set_init_value(0.5f);
    t->mutable_optimizer()->set_learning_rate(0.1f);
    CreateTensorResponse created;
    REQUIRE(ps->CreateTensor(&ctx, create, &created).ok());
    REQUIRE(first->process->Signal(SIGTERM).ok());
    absl::StatusOr<int> exit = first->process->Wait(absl::Seconds(60));
    REQUIRE(exit.ok());
    REQUIRE(*exit == 0);
  }
  const std::string health_file = testing::UniqueTmpPath("health_port");
  const std::string port_file = testing::UniqueTmpPath("port");
  absl::StatusOr<std::unique_ptr<testing::Subprocess>> shard =
      testing::Subprocess::Start(
          testing::RunfilePath("server/ps_server"),
          {"--log_level=info", "--port=0", "--port_file=" + port_file,
           "--checkpoint_dir=" + dir, "--health_port=0",
           "--health_port_file=" + health_file});
  REQUIRE(shard.ok());
  INFO("server log:\n" << (*shard)->LogTail());
  REQUIRE(testing::WaitFor(
              [&] {
                std::ifstream in(health_file);
                std::string line;
                return std::getline(in, line) && !in.eof();
              },
              absl::Seconds(30), "the health port file")
              .ok());
  auto stub = Health::NewStub(
      MakeChannel(absl::StrCat("127.0.0.1:", ReadPort(health_file))));
  // Polled until SERVING: NOT_SERVING comes first (the restore), and the
  // shard's own port is announced only once it serves.
  int not_serving = 0, alive_while_restoring = 0;
  bool port_before_serving = false;
  REQUIRE(testing::WaitFor(
              [&] {
                // The port file is read before the check: read after it,
                // it may have been written between the two.
                const bool port_announced = ReadPort(port_file) > 0;
                HealthCheckResponse resp;
                if (!Check(stub.get(), "", &resp).ok()) return false;
                if (resp.status() == HealthCheckResponse::SERVING) return true;
                ++not_serving;
                // Alive meanwhile: a liveness or startup probe asks this.
                HealthCheckResponse process;
                alive_while_restoring +=
                    Check(stub.get(), "asyncps.Process", &process).ok() &&
                    process.status() == HealthCheckResponse::SERVING;
                port_before_serving |= port_announced;
                return false;
              },
              absl::Seconds(120), "SERVING after the restore",
              absl::Milliseconds(1))
              .ok());
  CHECK(not_serving > 0);
  CHECK(alive_while_restoring == not_serving);
  CHECK_FALSE(port_before_serving);
  HealthCheckResponse resp;
  REQUIRE(Check(stub.get(), "asyncps.ParameterServer", &resp).ok());
  CHECK(resp.status() == HealthCheckResponse::SERVING);
  const std::string log = (*shard)->ReadLog();
  CHECK(log.find("NOT_SERVING until the shard has restored") !=
        std::string::npos);
  CHECK(log.find("restoring checkpoint") != std::string::npos);
  CHECK(log.find("restored checkpoint") != std::string::npos);
}

TEST_CASE("server reflection v1 lists the services and serves descriptors",
          "[monitoring][reflection]") {
  namespace refl = grpc::reflection::v1;
  absl::StatusOr<ServerProcess> server =
      testing::StartPsServer(0, 1, {"--log_level=warn"});
  REQUIRE(server.ok());
  INFO("server log:\n" << server->process->LogTail());
  auto stub = refl::ServerReflection::NewStub(MakeChannel(server->address));

  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + kDeadline));
  auto stream = stub->ServerReflectionInfo(&ctx);
  refl::ServerReflectionRequest list;
  list.set_list_services("");
  refl::ServerReflectionRequest symbol;
  symbol.set_file_containing_symbol("asyncps.ParameterServer");
  refl::ServerReflectionRequest missing;
  missing.set_file_containing_symbol("no.such.Thing");
  REQUIRE(stream->Write(list));
  REQUIRE(stream->Write(symbol));
  REQUIRE(stream->Write(missing));
  REQUIRE(stream->WritesDone());
  refl::ServerReflectionResponse listed, file, not_found;
  REQUIRE(stream->Read(&listed));
  REQUIRE(stream->Read(&file));
  REQUIRE(stream->Read(&not_found));
  REQUIRE(stream->Finish().ok());

  std::set<std::string> services;
  for (const auto& svc : listed.list_services_response().service()) {
    services.insert(svc.name());
  }
  CHECK(services ==
        std::set<std::string>{"asyncps.ParameterServer", "asyncps.SlotMoves",
                              "grpc.health.v1.Health",
                              "grpc.reflection.v1.ServerReflection",
                              "grpc.reflection.v1alpha.ServerReflection"});
  REQUIRE(file.has_file_descriptor_response());
  REQUIRE(file.file_descriptor_response().file_descriptor_proto_size() >= 1);
  google::protobuf::FileDescriptorProto proto;
  REQUIRE(proto.ParseFromString(
      file.file_descriptor_response().file_descriptor_proto(0)));
  CHECK(proto.package() == "asyncps");
  bool has_service = false;
  for (const auto& svc : proto.service()) {
    has_service |= svc.name() == "ParameterServer";
  }
  CHECK(has_service);
  CHECK(not_found.error_response().error_code() ==
        static_cast<int>(grpc::StatusCode::NOT_FOUND));
}

TEST_CASE(
    "server reflection, v1 and v1alpha, refuses a request over 64 KiB before "
    "parsing it, and the next stream is answered",
    "[monitoring][reflection][bad_input]") {
  absl::StatusOr<ServerProcess> server =
      testing::StartPsServer(0, 1, {"--log_level=warn"});
  REQUIRE(server.ok());
  INFO("server log:\n" << server->process->LogTail());
  // 32 MiB of empty unknown fields: gRPC's own v1alpha service parsed them
  // (and echoed the request in its answer): 64 MiB took a shard to 4.3 GB.
  const std::string flood = testing::EmptyUnknownFields(32 << 20);
  const pid_t pid = server->process->pid();
  const int64_t before = testing::ReadProcessResources(pid)->peak_rss_bytes;
  const auto channel = MakeChannel(server->address);
  for (const std::string version : {"v1", "v1alpha"}) {
    const std::string method = "/grpc.reflection." + version +
                               ".ServerReflection/ServerReflectionInfo";
    INFO(method);
    grpc::Status s = testing::RawStreaming(channel, method, {flood}, 60);
    CHECK(s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
    CHECK(s.error_message().find("the limit is 65536") != std::string::npos);
    // Bytes that do not parse end the stream INVALID_ARGUMENT.
    s = testing::RawStreaming(channel, method,
                              {std::string("\x1a\xe8\x07abc", 6)});
    CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  }
  const int64_t after = testing::ReadProcessResources(pid)->peak_rss_bytes;
  INFO("peak RSS " << before / 1e6 << " MB -> " << after / 1e6 << " MB");
  CHECK(after - before < (200 << 20));
  // A real request on a new stream is answered.
  namespace refl = grpc::reflection::v1alpha;
  auto stub = refl::ServerReflection::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + kDeadline));
  auto stream = stub->ServerReflectionInfo(&ctx);
  refl::ServerReflectionRequest list;
  list.set_list_services("");
  REQUIRE(stream->Write(list));
  REQUIRE(stream->WritesDone());
  refl::ServerReflectionResponse listed;
  REQUIRE(stream->Read(&listed));
  CHECK(listed.list_services_response().service_size() == 5);
  CHECK(stream->Finish().ok());
}

}  // namespace
}  // namespace asyncps
