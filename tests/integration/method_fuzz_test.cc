// Every method a shard serves, fed random bytes and random protobuf wire
// data (fields of any number and type, nested, truncated), unary and
// streaming, from a fixed seed: the shard never crashes or hangs, never
// answers as if it had a bug (UNKNOWN, INTERNAL, DATA_LOSS), and the run's
// state stays as it was.

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/ps_client.h"
#include "common/net.h"
#include "tests/testing/raw_calls.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/tensor_specs.h"

namespace asyncps {
namespace {

using testing::ServerProcess;

constexpr int kElems = 64;

std::vector<float> Read(PsClient* c) {
  std::vector<float> w(kElems);
  REQUIRE_OK(c->StartPull(0, 0, PullSet{{{"w", w.data()}}, {}})->Wait());
  return w;
}

TEST_CASE(
    "random bytes and random protobuf data on every method never crash a "
    "shard, never look like its bug, and change nothing",
    "[bad_input][fuzz]") {
  auto cluster = testing::StartPsCluster(2, {"--num_slots=16"});
  REQUIRE_OK(cluster.status());
  PsClientOptions o;
  for (const ServerProcess& s : *cluster) o.servers.push_back(s.address);
  o.retry.call_deadline = absl::Seconds(30);
  std::unique_ptr<PsClient> c = PsClient::Connect(o).value();
  REQUIRE_OK(c->WaitForShards(absl::Seconds(30)));
  REQUIRE_OK(c->Register().status());
  REQUIRE_OK(c->CreateTensors({testing::ConstantSpec(
      "w", {kElems}, 1.0f, testing::SgdSpec(1.0f), 16)}));
  const std::vector<float> before = Read(c.get());
  const uint64_t epoch = c->map().epoch();

  const std::vector<std::string> unary = {
      "/asyncps.ParameterServer/CreateTensor",
      "/asyncps.ParameterServer/ListTensors",
      "/asyncps.ParameterServer/SetLearningRate",
      "/asyncps.ParameterServer/Heartbeat",
      "/asyncps.ParameterServer/Pull",
      "/asyncps.ParameterServer/Push",
      "/asyncps.ParameterServer/Status",
      "/asyncps.ParameterServer/Checkpoint",
      "/asyncps.SlotMoves/MoveSlots",
      "/asyncps.SlotMoves/FinishMove",
      "/asyncps.SlotMoves/MoveState",
      "/asyncps.SlotMoves/AdoptMap",
      "/asyncps.SlotMoves/ReadMapRecord",
      "/asyncps.SlotMoves/SwapMapRecord",
      "/grpc.health.v1.Health/Check",
  };
  const std::vector<std::string> streaming = {
      "/asyncps.ParameterServer/PullStream",
      "/asyncps.ParameterServer/PushStream",
      "/asyncps.ParameterServer/StepStream",
      "/asyncps.SlotMoves/ExportSlots",
      "/asyncps.ReplicaFeed/Follow",
      "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
  };
  const grpc::StatusCode kBug[] = {grpc::StatusCode::UNKNOWN,
                                   grpc::StatusCode::INTERNAL,
                                   grpc::StatusCode::DATA_LOSS};
  testing::RandomWire input(20261206);
  for (const ServerProcess& shard : *cluster) {
    const std::shared_ptr<grpc::Channel> channel = MakeChannel(shard.address);
    auto check = [&](const std::string& method, const grpc::Status& s,
                     const std::string& what) {
      INFO(method << " at " << shard.address << ": " << what << " -> "
                  << s.error_code() << " " << s.error_message());
      for (grpc::StatusCode bug : kBug) CHECK(s.error_code() != bug);
      CHECK(s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED);
      CHECK(s.error_code() != grpc::StatusCode::UNAVAILABLE);
    };
    for (const std::string& method : unary) {
      std::map<int, int> codes;
      for (int i = 0; i < 120; ++i) {
        const std::string bytes = input.Next();
        const grpc::Status s = testing::RawUnary(channel, method, bytes, 5);
        ++codes[s.error_code()];
        check(method, s, absl::StrCat("input ", i, " of ", bytes.size(), " B"));
      }
      for (auto [code, n] : codes) INFO(method << ": code " << code << " x" << n);
    }
    for (const std::string& method : streaming) {
      for (int i = 0; i < 30; ++i) {
        std::vector<std::string> messages(1 + i % 3);
        for (std::string& m : messages) m = input.Next();
        check(method, testing::RawStreaming(channel, method, messages, 5),
              absl::StrCat("stream ", i));
      }
    }
    REQUIRE(shard.process->Running());
  }
  CHECK(Read(c.get()) == before);
  CHECK(c->map().epoch() == epoch);
}

}  // namespace
}  // namespace asyncps
