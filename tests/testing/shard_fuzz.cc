#include "tests/testing/shard_fuzz.h"

#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/net.h"

namespace asyncps {
namespace testing {

namespace {

const std::vector<std::string>& UnaryMethods() {
  static const auto* methods = new std::vector<std::string>{
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
  return *methods;
}

const std::vector<std::string>& StreamingMethods() {
  static const auto* methods = new std::vector<std::string>{
      "/asyncps.ParameterServer/PullStream",
      "/asyncps.ParameterServer/PushStream",
      "/asyncps.ParameterServer/StepStream",
      "/asyncps.SlotMoves/ExportSlots",
      "/asyncps.ReplicaFeed/Follow",
      "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
  };
  return *methods;
}

// UNAVAILABLE from the shard itself (a backup refusing a write, naming
// the primary) is an answer; from gRPC (no message, or the connection
// failed) it means the shard is gone.
bool ReadsAsBug(const grpc::Status& s) {
  switch (s.error_code()) {
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::DATA_LOSS:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return true;
    case grpc::StatusCode::UNAVAILABLE: {
      const std::string& m = s.error_message();
      return m.empty() || absl::StrContains(m, "connect") ||
             absl::StrContains(m, "Socket closed") ||
             absl::StrContains(m, "reset");
    }
    default:
      return false;
  }
}

}  // namespace

std::vector<std::string> FuzzShardMethods(const std::string& address,
                                          RandomWire* input, int unary_inputs,
                                          int streams) {
  const std::shared_ptr<grpc::Channel> channel = MakeChannel(address);
  std::vector<std::string> bugs;
  auto note = [&](const std::string& method, const std::string& what,
                  const grpc::Status& s) {
    if (!ReadsAsBug(s)) return;
    bugs.push_back(absl::StrCat(method, " at ", address, ": ", what, " -> ",
                                s.error_code(), " ", s.error_message()));
  };
  for (const std::string& method : UnaryMethods()) {
    for (int i = 0; i < unary_inputs; ++i) {
      const std::string bytes = input->Next();
      note(method, absl::StrCat("input ", i, " of ", bytes.size(), " B"),
           RawUnary(channel, method, bytes, 5));
    }
  }
  for (const std::string& method : StreamingMethods()) {
    for (int i = 0; i < streams; ++i) {
      std::vector<std::string> messages(1 + i % 3);
      for (std::string& m : messages) m = input->Next();
      note(method, absl::StrCat("stream ", i),
           RawStreaming(channel, method, messages, 5));
    }
  }
  return bugs;
}

}  // namespace testing
}  // namespace asyncps
