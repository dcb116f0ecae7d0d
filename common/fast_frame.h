#ifndef ASYNCPS_COMMON_FAST_FRAME_H_
#define ASYNCPS_COMMON_FAST_FRAME_H_

// Frames of the fast data path (PullStream, PushStream): a protobuf header
// and raw payload bytes in one grpc::ByteBuffer, so that parameters and
// gradients skip protobuf `bytes` fields. Senders build frames with
// MakeFrame from their buffers' grpc::Slices; receivers read the payload in
// place with a FrameReader. The byte layout is described below.
//
// Example:
//
//   // Sending 4 floats for slice 0 of "w"; grad_bytes says how many bytes.
//   PushRequest header;
//   SliceGradient* g = header.add_grads();
//   g->set_tensor("w");
//   g->set_grad_bytes(4 * sizeof(float));
//   grpc::ByteBuffer frame =
//       MakeFrame(header, {grpc::Slice(grad, 4 * sizeof(float))});
//
//   // Receiving it (network input: every length is checked).
//   FrameReader reader;
//   PushRequest got;
//   absl::Status s = reader.Open(frame, &got);
//   std::vector<Payload> grads(got.grads_size());  // views of the frame
//   for (int i = 0; s.ok() && i < got.grads_size(); ++i) {
//     s = reader.Next(got.grads(i).grad_bytes(), &grads[i]);
//   }

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/payload.h"
#include "google/protobuf/message_lite.h"

namespace asyncps {

// The framing of the fast data path (PullStream / PushStream in
// proto/asyncps.proto): a frame is
//
//   header_length (4 bytes, little-endian) | header (protobuf)
//   | zero padding to a multiple of kFrameAlignment bytes | payload
//
// carried in a grpc::ByteBuffer without going through protobuf `bytes`
// fields, so that payloads are sent from and read in place of the buffers
// that hold them. The padding puts the payload at an aligned offset from the
// start of the message.

inline constexpr size_t kFrameAlignment = 64;

// Full method names, for a generic stub.
inline constexpr char kPullStreamMethod[] =
    "/asyncps.ParameterServer/PullStream";
inline constexpr char kPushStreamMethod[] =
    "/asyncps.ParameterServer/PushStream";
inline constexpr char kStepStreamMethod[] =
    "/asyncps.ParameterServer/StepStream";

// A frame of `header` followed by `payload` (slices in order; not copied).
grpc::ByteBuffer MakeFrame(const google::protobuf::MessageLite& header,
                           const std::vector<grpc::Slice>& payload);

// A plain protobuf message in a ByteBuffer (one slice), and back.
grpc::ByteBuffer SerializeToByteBuffer(
    const google::protobuf::MessageLite& message);
// INVALID_ARGUMENT naming the message type when the bytes do not parse;
// RESOURCE_EXHAUSTED, before parsing, when the parsed form would take far
// more memory than the bytes (common/parse_cost.h).
absl::Status ParseFromByteBuffer(const grpc::ByteBuffer& buffer,
                                 google::protobuf::MessageLite* message);
// The same for contiguous bytes; errors start with `what` ("request").
absl::Status ParseBounded(absl::string_view bytes,
                          google::protobuf::MessageLite* message,
                          absl::string_view what);

// A unary call taken as bytes: parses `in` as a Request (as above), runs
// body(request, &response) and, when it succeeds, serializes the response
// into `out`. Returns the parse's or the body's status.
template <typename Request, typename Response, typename Body>
absl::Status AnswerBytes(const grpc::ByteBuffer& in, grpc::ByteBuffer* out,
                         Body body) {
  Request request;
  absl::Status s = ParseFromByteBuffer(in, &request);
  if (!s.ok()) return s;
  Response response;
  s = body(request, &response);
  if (s.ok()) *out = SerializeToByteBuffer(response);
  return s;
}

// Reads one frame: the header, then the payload piece by piece, in place.
// Network input: every length is checked against what the buffer holds.
// Holds references to the buffer's slices, so the views it hands out stay
// valid as long as the reader lives. Thread-compatible.
class FrameReader {
 public:
  // Parses the header of the frame in `buffer` into `header` and skips the
  // padding. INVALID_ARGUMENT when the length prefix or padding runs past
  // the buffer, or the header does not parse.
  absl::Status Open(const grpc::ByteBuffer& buffer,
                    google::protobuf::MessageLite* header);
  // Opens `buffer` as payload alone (no prefix, no header): to read other
  // wire bytes in place. INVALID_ARGUMENT when the buffer is unreadable.
  absl::Status OpenBytes(const grpc::ByteBuffer& buffer);

  // Appends the next n payload bytes to `out` as views of the buffer.
  // INVALID_ARGUMENT (nothing consumed) if fewer than n bytes remain.
  absl::Status Next(uint64_t n, Payload* out);
  // Copies the next n payload bytes to `out`; same errors as Next.
  absl::Status CopyNext(uint64_t n, char* out);
  // Decodes the next n payload bytes, wire values of `dtype`, as floats to
  // out[0, n / WireBytes(dtype)); same errors as Next.
  absl::Status DecodeNext(uint64_t n, WireDtype dtype, float* out);

  // Payload bytes not read yet.
  uint64_t remaining() const { return remaining_; }

  // The bytes of `payload`, which Next gave from this reader's buffer, as
  // slices that share the buffer's memory (no copy of a refcounted slice):
  // they keep it alive once the reader and the buffer are gone. Bytes not
  // from this buffer are copied.
  std::vector<grpc::Slice> Share(const Payload& payload) const;
  // What to keep of `payload` once the buffer is gone: Share's slices for
  // payloads of kKeepSharedFrom bytes or more; a smaller one is copied into
  // a slice of its own, since a shared slice keeps its whole receive
  // buffer alive, which can be much larger than the payload.
  static constexpr size_t kKeepSharedFrom = 16 << 10;
  std::vector<grpc::Slice> Keep(const Payload& payload) const;

 private:
  // Consumes n bytes, calling piece(view) for each contiguous run.
  // REQUIRES: n <= remaining_.
  template <typename F>
  void Consume(uint64_t n, F piece);

  std::vector<grpc::Slice> slices_;
  size_t index_ = 0;   // current slice
  size_t offset_ = 0;  // within it
  uint64_t remaining_ = 0;
};

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_FAST_FRAME_H_
