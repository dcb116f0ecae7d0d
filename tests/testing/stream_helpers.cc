#include "tests/testing/stream_helpers.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <utility>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/fast_frame.h"
#include "common/net.h"
#include "common/payload.h"
#include "tests/testing/require_ok.h"

namespace asyncps {
namespace testing {

absl::StatusOr<uint64_t> PushAnswerId(const grpc::ByteBuffer& answer) {
  PushResponse r;
  absl::Status s = ParseFromByteBuffer(answer, &r);
  if (!s.ok()) return s;
  return r.request_id();
}

absl::StatusOr<uint64_t> PullAnswerId(const grpc::ByteBuffer& answer) {
  PullResponse r;
  FrameReader reader;
  absl::Status s = reader.Open(answer, &r);
  if (!s.ok()) return s;
  return r.request_id();
}

grpc::ByteBuffer Exchange(DataStream* stream, uint64_t id,
                          grpc::ByteBuffer request) {
  absl::Notification done;
  absl::Status status;
  grpc::ByteBuffer answer;
  stream->Send(id, std::move(request),
               [&](absl::Status s, grpc::ByteBuffer* a) {
                 status = s;
                 if (a != nullptr) answer = *a;
                 done.Notify();
               });
  REQUIRE(stream->queue()->WaitUntil(
      absl::Seconds(15), [&done] { return done.HasBeenNotified(); }));
  REQUIRE_OK(status);
  return answer;
}

std::string FrameBytes(const PushRequest& header, const std::string& payload) {
  grpc::ByteBuffer frame = MakeFrame(header, {});
  std::vector<grpc::Slice> slices;
  REQUIRE(frame.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out + payload;
}

grpc::ByteBuffer Sliced(const std::string& bytes, size_t piece) {
  std::vector<grpc::Slice> slices;
  for (size_t i = 0; i < bytes.size(); i += piece) {
    slices.emplace_back(bytes.data() + i, std::min(piece, bytes.size() - i));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Floats(const std::vector<float>& v) {
  std::string out;
  EncodeFloats(v.data(), v.size(), &out);
  return out;
}

grpc::ByteBuffer PushFrameOf(const PushRequest& push, uint64_t id) {
  PushRequest header = push;
  header.set_request_id(id);
  header.set_wire_dtype(WIRE_F32);
  std::vector<grpc::Slice> payload;
  for (SliceGradient& g : *header.mutable_grads()) {
    g.set_grad_bytes(g.grad().size());
    payload.emplace_back(g.grad().data(), g.grad().size());
    g.clear_grad();
  }
  for (RowsGradient& g : *header.mutable_rows()) {
    g.set_grad_bytes(g.grad().size());
    payload.emplace_back(g.grad().data(), g.grad().size());
    g.clear_grad();
  }
  return MakeFrame(header, payload);
}

ShardStreams::ShardStreams(const std::shared_ptr<grpc::Channel>& channel)
    : pushes_(std::make_unique<DataStream>(channel, kPushStreamMethod,
                                           PushAnswerId, &queue_)),
      pulls_(std::make_unique<DataStream>(channel, kPullStreamMethod,
                                          PullAnswerId, &queue_)),
      steps_(std::make_unique<DataStream>(channel, kStepStreamMethod,
                                          PullAnswerId, &queue_)) {}

PushResponse ShardStreams::PushFrame(uint64_t id,
                                     const grpc::ByteBuffer& frame) {
  PushResponse r;
  REQUIRE_OK(ParseFromByteBuffer(Exchange(pushes_.get(), id, frame), &r));
  CHECK(r.request_id() == id);
  return r;
}

PushResponse ShardStreams::Push(const PushRequest& push) {
  const uint64_t id = next_id_++;
  return PushFrame(id, PushFrameOf(push, id));
}

PullResponse ShardStreams::Pull(PullRequest pull) {
  const uint64_t id = next_id_++;
  pull.set_request_id(id);
  pull.set_wire_dtype(WIRE_F32);
  return Unframed(Exchange(pulls_.get(), id, SerializeToByteBuffer(pull)), id);
}

PullResponse ShardStreams::Step(const PushRequest& push) {
  const uint64_t id = next_id_++;
  return StepFrame(id, PushFrameOf(push, id));
}

PullResponse ShardStreams::StepFrame(uint64_t id,
                                     const grpc::ByteBuffer& frame) {
  return Unframed(Exchange(steps_.get(), id, frame), id);
}

PullResponse ShardStreams::Unframed(const grpc::ByteBuffer& answer,
                                    uint64_t id) {
  FrameReader reader;
  PullResponse header;
  REQUIRE_OK(reader.Open(answer, &header));
  CHECK(header.request_id() == id);
  for (SliceData& d : *header.mutable_slices()) {
    std::string* values = d.mutable_values();
    values->resize(d.payload_bytes());
    REQUIRE_OK(reader.CopyNext(d.payload_bytes(), values->data()));
    d.clear_payload_bytes();
  }
  for (RowsData& d : *header.mutable_rows()) {
    std::string* values = d.mutable_values();
    values->resize(d.payload_bytes());
    REQUIRE_OK(reader.CopyNext(d.payload_bytes(), values->data()));
    d.clear_payload_bytes();
  }
  REQUIRE(reader.remaining() == 0);
  return header;
}

OneTensorShard StartOneTensorShard(int64_t elems) {
  absl::StatusOr<ServerProcess> server =
      StartPsServer(0, 1, {"--log_level=warn"});
  REQUIRE_OK(server.status());
  OneTensorShard shard{*std::move(server), nullptr, nullptr};
  std::shared_ptr<grpc::Channel> channel = MakeChannel(shard.server.address);
  shard.stub = ParameterServer::NewStub(channel);
  shard.streams = std::make_unique<ShardStreams>(channel);
  CreateTensorRequest create;
  TensorSpec* s = create.add_tensors();
  s->set_name("w");
  s->add_shape(elems);
  s->set_init(INIT_CONSTANT);
  s->set_init_value(1.0f);
  s->set_slice_elems(elems);
  s->mutable_optimizer()->set_type(OPT_SGD);
  s->mutable_optimizer()->set_learning_rate(1.0f);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  CreateTensorResponse created;
  REQUIRE(shard.stub->CreateTensor(&ctx, create, &created).ok());
  return shard;
}

}  // namespace testing
}  // namespace asyncps
