#include "tests/testing/raw_calls.h"

#include <grpcpp/generic/generic_stub.h>

#include <chrono>

namespace asyncps {
namespace testing {

namespace {

grpc::ByteBuffer Buffer(const std::string& bytes) {
  grpc::Slice slice(bytes.data(), bytes.size());
  return grpc::ByteBuffer(&slice, 1);
}

void Varint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

}  // namespace

grpc::Status RawUnary(const std::shared_ptr<grpc::Channel>& channel,
                      const std::string& method, const std::string& bytes,
                      int deadline_s) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::seconds(deadline_s));
  grpc::CompletionQueue cq;
  grpc::ByteBuffer request = Buffer(bytes), response;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
      stub.PrepareUnaryCall(&ctx, method, request, &cq);
  call->StartCall();
  grpc::Status status;
  call->Finish(&response, &status, nullptr);
  void* tag;
  bool ok;
  cq.Next(&tag, &ok);  // the deadline ends the call
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

grpc::Status RawStreaming(const std::shared_ptr<grpc::Channel>& channel,
                          const std::string& method,
                          const std::vector<std::string>& messages,
                          int deadline_s) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  const auto deadline =
      std::chrono::system_clock::now() + std::chrono::seconds(deadline_s);
  ctx.set_deadline(deadline);
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub.PrepareCall(&ctx, method, &cq);
  // Waits for the operation tagged `tag`; false when it failed.
  auto wait = [&](intptr_t tag) {
    void* got = nullptr;
    bool ok = false;
    while (cq.AsyncNext(&got, &ok, deadline) ==
           grpc::CompletionQueue::NextStatus::GOT_EVENT) {
      if (reinterpret_cast<intptr_t>(got) == tag) return ok;
    }
    ctx.TryCancel();
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
    wait(3);
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

uint64_t RandomWire::Below(uint64_t n) { return n == 0 ? 0 : rng_() % n; }

std::string RandomWire::Bytes(size_t n) {
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(Below(256));
  return out;
}

uint64_t RandomWire::Number() {
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

std::string RandomWire::Message(int depth) {
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
      Varint(body.size() + (Below(16) == 0 ? 1 + Below(1000) : 0), &out);
      out += body;
    }
  }
  return out;
}

std::string RandomWire::Next() {
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

std::string EmptyUnknownFields(size_t bytes) {
  std::string out;
  out.reserve(bytes + 1);
  while (out.size() + 2 <= bytes) out.append("\x7a\x00", 2);
  return out;
}

}  // namespace testing
}  // namespace asyncps
