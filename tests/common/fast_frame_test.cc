// FrameReader::Share: a payload read from a frame, in pieces across the
// frame's slices, handed on as slices that share the frame's memory (the
// log entry of a replicated push keeps them instead of a copy).

#include "common/fast_frame.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "proto/asyncps.pb.h"
#include "tests/testing/slices.h"

namespace asyncps {
namespace {

using testing::JoinSlices;

TEST_CASE("a payload's shared slices hold its bytes without a copy",
          "[frame]") {
  // Three refcounted slices (over gRPC's inline size); the second payload
  // spans the boundary between the second and the third.
  const std::string a(100, 'a'), b(200, 'b'), c(300, 'c');
  std::vector<grpc::Slice> shared;
  std::vector<const char*> at;
  FrameReader reader;
  {
    std::vector<grpc::Slice> payload = {grpc::Slice(a), grpc::Slice(b),
                                        grpc::Slice(c)};
    PushRequest header;
    header.set_request_id(7);
    const grpc::ByteBuffer frame = MakeFrame(header, payload);
    PushRequest read;
    REQUIRE(reader.Open(frame, &read).ok());
    CHECK(read.request_id() == 7);
    Payload first, second, third;
    REQUIRE(reader.Next(60, &first).ok());
    REQUIRE(reader.Next(340, &second).ok());  // 40 a, 200 b, 100 c
    REQUIRE(reader.Next(200, &third).ok());
    CHECK(reader.remaining() == 0);

    shared = reader.Share(second);
    REQUIRE(shared.size() == 3);
    CHECK(JoinSlices(shared) == a.substr(60) + b + c.substr(0, 100));
    // The same memory as the frame's (the payload's own pieces).
    for (size_t i = 0; i < shared.size(); ++i) {
      at.push_back(second.pieces()[i].data());
      CHECK(reinterpret_cast<const char*>(shared[i].begin()) == at[i]);
    }
    CHECK(JoinSlices(reader.Share(third)) == c.substr(100));
    CHECK(JoinSlices(reader.Share(first)) == a.substr(0, 60));
    reader = FrameReader();
  }
  // The slices outlive the reader, the frame and the payload's slices.
  CHECK(JoinSlices(shared) == a.substr(60) + b + c.substr(0, 100));
  CHECK(reinterpret_cast<const char*>(shared[1].begin()) == at[1]);

  // Bytes from elsewhere are copied.
  const std::string other = "not from the frame";
  std::vector<grpc::Slice> copied = reader.Share(Payload(other));
  CHECK(JoinSlices(copied) == other);
  CHECK(reinterpret_cast<const char*>(copied[0].begin()) != other.data());
}

}  // namespace
}  // namespace asyncps
