// ReservedPort (common/reserved_port.h): the port a replica advertises
// while it stands by stays its own. While held, a gRPC server cannot bind
// it (nor a socket with SO_REUSEADDR, as gRPC's listeners have); after
// Release a gRPC server serves there. A moved-from object holds nothing.
#include "common/reserved_port.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

// A gRPC server on 127.0.0.1:`port` serving `service` (which answers
// UNIMPLEMENTED; one per server), or null when it cannot bind there.
std::unique_ptr<grpc::Server> GrpcServerOn(
    int port, grpc::CallbackGenericService* service) {
  grpc::ServerBuilder b;
  b.RegisterCallbackGenericService(service);
  b.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int bound = 0;
  b.AddListeningPort(absl::StrCat("127.0.0.1:", port),
                     grpc::InsecureServerCredentials(), &bound);
  std::unique_ptr<grpc::Server> s = b.BuildAndStart();
  if (s != nullptr && bound != port) {
    s->Shutdown();
    s.reset();
  }
  return s;
}

TEST_CASE(
    "a held port cannot be bound by a gRPC server or a reusing socket; "
    "released, a gRPC server serves there",
    "[net]") {
  absl::StatusOr<ReservedPort> held = ReservedPort::Pick("127.0.0.1");
  REQUIRE(held.ok());
  REQUIRE(held->held());
  const int port = held->port();
  REQUIRE(port > 0);
  CHECK_FALSE(testing::LoopbackPortBindable(port));
  grpc::CallbackGenericService refused, served;
  CHECK(GrpcServerOn(port, &refused) == nullptr);
  held->Release();
  CHECK_FALSE(held->held());
  CHECK(held->port() == port);
  held->Release();  // idempotent
  std::unique_ptr<grpc::Server> server = GrpcServerOn(port, &served);
  REQUIRE(server != nullptr);
  server->Shutdown();
}

TEST_CASE("a moved port is held by its new owner only", "[net]") {
  absl::StatusOr<ReservedPort> first = ReservedPort::Pick("0.0.0.0");
  REQUIRE(first.ok());
  const int port = first->port();
  ReservedPort second = *std::move(first);
  CHECK_FALSE(first->held());
  CHECK(second.held());
  CHECK(second.port() == port);
  first->Release();  // the moved-from one closes nothing
  CHECK_FALSE(testing::LoopbackPortBindable(port));
  {
    ReservedPort third;
    third = std::move(second);
    CHECK_FALSE(testing::LoopbackPortBindable(port));
  }  // destroyed: released
  CHECK(testing::LoopbackPortBindable(port));
}

}  // namespace
}  // namespace asyncps
