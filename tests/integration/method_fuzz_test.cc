// Every method a shard serves, fed random bytes and random protobuf wire
// data (fields of any number and type, nested, truncated), unary and
// streaming, from a fixed seed: the shard never crashes or hangs, never
// answers as if it had a bug (UNKNOWN, INTERNAL, DATA_LOSS), and the run's
// state stays as it was.

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/ps_client.h"
#include "common/net.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/tensor_specs.h"

namespace asyncps {
namespace {

using testing::ServerProcess;

constexpr int kElems = 64;

// Random inputs from one seeded generator.
class RandomInput {
 public:
  explicit RandomInput(uint32_t seed) : rng_(seed) {}

  // Plain bytes, wire data, or wire data cut short.
  std::string Next() {
    switch (Below(4)) {
      case 0:
        return Bytes(Below(300));
      case 1: {
        std::string m = Message(0);
        return m.substr(0, Below(m.size() + 1));
      }
      default:
        return Message(0);
    }
  }

 private:
  uint64_t Below(uint64_t n) { return n == 0 ? 0 : rng_() % n; }

  std::string Bytes(size_t n) {
    std::string out(n, '\0');
    for (char& c : out) c = static_cast<char>(Below(256));
    return out;
  }

  static void Varint(uint64_t v, std::string* out) {
    while (v >= 0x80) {
      out->push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    out->push_back(static_cast<char>(v));
  }

  // A value a field may hold: small and edge numbers, any 64 bits.
  uint64_t Number() {
    switch (Below(5)) {
      case 0:
        return Below(4);
      case 1:
        return Below(100000);
      case 2:
        return ~uint64_t{0} - Below(3);  // negative as int64
      case 3:
        return uint64_t{1} << Below(64);
      default:
        return (static_cast<uint64_t>(rng_()) << 32) | rng_();
    }
  }

  // 1-8 fields of numbers 1-24 (most messages here use the low ones), any
  // wire type; length-delimited ones hold bytes, text, packed numbers or a
  // nested message.
  std::string Message(int depth) {
    std::string out;
    const int fields = 1 + static_cast<int>(Below(8));
    for (int f = 0; f < fields; ++f) {
      const uint64_t number = 1 + Below(24);
      const int type = static_cast<int>(Below(4));
      const int wire = type == 0 ? 0 : type == 1 ? 2 : type == 2 ? 5 : 1;
      Varint(number << 3 | wire, &out);
      if (wire == 0) {
        Varint(Number(), &out);
      } else if (wire == 5) {
        out += Bytes(4);
      } else if (wire == 1) {
        out += Bytes(8);
      } else {
        std::string body;
        switch (depth < 3 ? Below(4) : Below(3)) {
          case 0:
            body = Bytes(Below(64));
            break;
          case 1:
            body = std::string(Below(32), static_cast<char>('a' + Below(26)));
            break;
          case 2:
            for (int i = static_cast<int>(Below(16)); i > 0; --i) {
              Varint(Number(), &body);
            }
            break;
          default:
            body = Message(depth + 1);
        }
        // Now and then a length that runs past the end.
        Varint(body.size() + (Below(16) == 0 ? 1 + Below(1000) : 0), &out);
        out += body;
      }
    }
    return out;
  }

  std::mt19937 rng_;
};

std::unique_ptr<grpc::ClientContext> Context() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  return ctx;
}

grpc::ByteBuffer Buffer(const std::string& bytes) {
  grpc::Slice slice(bytes.data(), bytes.size());
  return grpc::ByteBuffer(&slice, 1);
}

// One unary call of `bytes` to `method`: its status.
grpc::Status Unary(grpc::GenericStub* stub, const std::string& method,
                   const std::string& bytes) {
  grpc::ByteBuffer request = Buffer(bytes), response;
  auto ctx = Context();
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status result;
  stub->UnaryCall(ctx.get(), method, grpc::StubOptions(), &request, &response,
                  [&](grpc::Status s) {
                    std::lock_guard<std::mutex> l(mu);
                    result = s;
                    done = true;
                    cv.notify_all();
                  });
  std::unique_lock<std::mutex> l(mu);
  if (!cv.wait_for(l, std::chrono::seconds(10), [&] { return done; })) {
    ctx->TryCancel();
    cv.wait(l, [&] { return done; });
  }
  return result;
}

// One streaming call to `method` that sends `messages`, then is done
// sending, and reads every answer: its status. Every step waits at most
// until the call's deadline.
grpc::Status Streaming(grpc::GenericStub* stub, const std::string& method,
                       const std::vector<std::string>& messages) {
  grpc::CompletionQueue cq;
  auto ctx = Context();
  const auto deadline =
      std::chrono::system_clock::now() + std::chrono::seconds(10);
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub->PrepareCall(ctx.get(), method, &cq);
  // Waits for the operation tagged `tag`; false when it failed.
  auto wait = [&](intptr_t tag) {
    void* got = nullptr;
    bool ok = false;
    while (cq.AsyncNext(&got, &ok, deadline) ==
           grpc::CompletionQueue::NextStatus::GOT_EVENT) {
      if (reinterpret_cast<intptr_t>(got) == tag) return ok;
    }
    ctx->TryCancel();
    return false;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  bool open = wait(1);
  for (size_t i = 0; open && i < messages.size(); ++i) {
    grpc::ByteBuffer b = Buffer(messages[i]);
    call->Write(b, reinterpret_cast<void*>(2));
    open = wait(2);
  }
  if (open) {
    call->WritesDone(reinterpret_cast<void*>(3));
    open = wait(3);
  }
  grpc::ByteBuffer answer;
  for (int reads = 0; reads < 1000; ++reads) {
    call->Read(&answer, reinterpret_cast<void*>(4));
    if (!wait(4)) break;
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  wait(5);
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

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
  RandomInput input(20261206);
  for (const ServerProcess& shard : *cluster) {
    grpc::GenericStub stub(MakeChannel(shard.address));
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
        const grpc::Status s = Unary(&stub, method, bytes);
        ++codes[s.error_code()];
        check(method, s, absl::StrCat("input ", i, " of ", bytes.size(), " B"));
      }
      for (auto [code, n] : codes) INFO(method << ": code " << code << " x" << n);
    }
    for (const std::string& method : streaming) {
      for (int i = 0; i < 30; ++i) {
        std::vector<std::string> messages(1 + i % 3);
        for (std::string& m : messages) m = input.Next();
        check(method, Streaming(&stub, method, messages),
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
