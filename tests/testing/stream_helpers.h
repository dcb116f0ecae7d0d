#ifndef ASYNCPS_TESTS_TESTING_STREAM_HELPERS_H_
#define ASYNCPS_TESTS_TESTING_STREAM_HELPERS_H_

// Speaking the data streams (PullStream / PushStream / StepStream,
// common/fast_frame.h)
// to one shard request by request, for tests that compare them with the
// protobuf Pull / Push RPCs or send them malformed frames:
//
//   testing::ShardStreams streams(MakeChannel(address));
//   PushRequest push = ...;                  // grads inside, as for Push
//   PushResponse r = streams.Push(push);     // the same push as a frame
//   PullResponse p = streams.Pull(pull);     // values as Pull gives them
//
// Every wait is bounded (15 s) and REQUIREd, so a shard that does not answer
// fails the test instead of hanging it.

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/data_stream.h"
#include "proto/asyncps.grpc.pb.h"
#include "proto/asyncps.pb.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace testing {

// The request id of a PushStream / PullStream answer (a DataStream::IdOf).
absl::StatusOr<uint64_t> PushAnswerId(const grpc::ByteBuffer& answer);
absl::StatusOr<uint64_t> PullAnswerId(const grpc::ByteBuffer& answer);

// Sends one request on `stream` and waits for its answer (driving the
// stream's queue).
grpc::ByteBuffer Exchange(DataStream* stream, uint64_t id,
                          grpc::ByteBuffer request);

// The bytes of a PushStream frame: `header` (with its padding), then
// `payload` as given (which may disagree with the header, on purpose).
std::string FrameBytes(const PushRequest& header, const std::string& payload);

// All of `bytes` as one buffer cut into slices of `piece` bytes.
grpc::ByteBuffer Sliced(const std::string& bytes, size_t piece);

// Little-endian float32 bytes of `v`.
std::string Floats(const std::vector<float>& v);

// The PushStream frame of a protobuf push: every gradient's bytes (slices,
// then rows) move from the message (`grad`) to the payload (`grad_bytes`),
// in order; wire_dtype float32; request_id `id`.
grpc::ByteBuffer PushFrameOf(const PushRequest& push, uint64_t id);

// Both data streams to one shard.
class ShardStreams {
 public:
  explicit ShardStreams(const std::shared_ptr<grpc::Channel>& channel);

  DataStream* pushes() { return pushes_.get(); }
  DataStream* pulls() { return pulls_.get(); }

  // Sends `frame` as request `id`; the answer, whose id must be `id`.
  PushResponse PushFrame(uint64_t id, const grpc::ByteBuffer& frame);
  // Sends `push` (a protobuf push, PushFrameOf) with the next request id.
  PushResponse Push(const PushRequest& push);
  // Sends `pull` with the next request id and returns the answer's header
  // with the payload put back into SliceData.values and RowsData.values
  // (payload_bytes cleared), as the protobuf Pull answers. An answer with
  // an error status has no slices or rows.
  PullResponse Pull(PullRequest pull);
  // Sends `push` (a protobuf push whose then_pull, if any, is sent as it
  // is) on StepStream with the next request id; the answer as Pull's.
  PullResponse Step(const PushRequest& push);
  // Sends `frame` as StepStream request `id`; the answer, whose id must be
  // `id` (0 for a frame the shard cannot read).
  PullResponse StepFrame(uint64_t id, const grpc::ByteBuffer& frame);

 private:
  // A pull's or step's answer frame as the protobuf Pull answers it.
  static PullResponse Unframed(const grpc::ByteBuffer& answer, uint64_t id);

  DrivenQueue queue_;  // outlives the streams
  std::unique_ptr<DataStream> pushes_, pulls_, steps_;
  uint64_t next_id_ = 1000;
};

// A real ps_server of one shard holding "w": `elems` floats, all 1, in one
// slice, SGD with learning rate 1; its stub and data streams.
struct OneTensorShard {
  ServerProcess server;
  std::unique_ptr<ParameterServer::Stub> stub;
  std::unique_ptr<ShardStreams> streams;
};
OneTensorShard StartOneTensorShard(int64_t elems);

}  // namespace testing
}  // namespace asyncps

#endif  // ASYNCPS_TESTS_TESTING_STREAM_HELPERS_H_
