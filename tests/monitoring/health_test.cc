// A real ps_server answers the standard gRPC health check (SERVING while
// up) and lists its services through server reflection.

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <memory>
#include <set>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/net.h"
#include "proto/grpc_health_v1.grpc.pb.h"
#include "proto/grpc_reflection_v1alpha.grpc.pb.h"
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

}  // namespace
}  // namespace asyncps
