// The parse-cost estimate against what protobuf's parsed form really holds
// (SpaceUsedLong), for requests shaped as attacks and as real traffic, and
// the refusal before parsing.

#include "common/parse_cost.h"

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <string>

#include "common/fast_frame.h"
#include "proto/asyncps.pb.h"

namespace asyncps {
namespace {

// `unit` repeated to `bytes` bytes.
std::string Repeat(const std::string& unit, size_t bytes) {
  std::string out;
  while (out.size() + unit.size() <= bytes) out += unit;
  return out;
}

// A worker's push of `slices` slices of `tensor`, `bytes` of gradient each.
PushRequest RealPush(const std::string& tensor, int slices, size_t bytes) {
  PushRequest push;
  push.mutable_worker()->set_worker_id(3);
  push.mutable_worker()->set_incarnation(7);
  push.set_seq(9);
  for (int i = 0; i < slices; ++i) {
    SliceGradient* g = push.add_grads();
    g->set_tensor(tensor);
    g->set_slice(i);
    g->set_read_version(100 + i);
    g->set_grad(std::string(bytes, 'g'));
  }
  return push;
}

// The estimate is not below what the parsed message holds (protobuf's own
// count, which leaves out malloc's overhead), and not far above it.
template <typename Message>
void RequireCovers(const std::string& wire) {
  Message m;
  REQUIRE(m.ParseFromString(wire));
  const int64_t used = static_cast<int64_t>(m.SpaceUsedLong());
  const int64_t estimate =
      EstimateParseCost(wire, *Message::descriptor(), int64_t{1} << 40);
  INFO("wire " << wire.size() << " used " << used << " estimate " << estimate);
  REQUIRE(estimate >= used * 9 / 10);
  REQUIRE(estimate <= 4 * used + 4096);
}

TEST_CASE("the estimate covers what the parsed form holds", "[parse_cost]") {
  // Empty repeated messages, empty names, 1-byte packed ids, unknown
  // varints and strings, fields sent with the wrong wire type.
  RequireCovers<PushRequest>(Repeat(std::string("\x1a\x00", 2), 1 << 16));
  RequireCovers<PullRequest>(Repeat(std::string("\x12\x00", 2), 1 << 16));
  RequireCovers<PullRequest>(Repeat(std::string("\x32\x00", 2), 1 << 16));
  RequireCovers<PullRequest>(Repeat("\x50\x01", 1 << 16));
  RequireCovers<PullRequest>(Repeat(std::string("\x5a\x01x", 3), 1 << 16));
  RequireCovers<PullRequest>(Repeat("\x10\x01", 1 << 16));
  TableIds ids;
  for (int i = 0; i < 100000; ++i) ids.add_ids(i % 100);
  RequireCovers<TableIds>(ids.SerializeAsString());
  // Real traffic: a push of 1000 slices of 16 floats each.
  RequireCovers<PushRequest>(
      RealPush("layer1/weights", 1000, 64).SerializeAsString());
}

TEST_CASE(
    "requests that would take far more memory than their size are refused "
    "before they are parsed; real ones parse",
    "[parse_cost][bad_input]") {
  // 4 MiB of empty SliceGradients: 2 bytes each, ~90 parsed.
  const std::string flood = Repeat(std::string("\x1a\x00", 2), 4 << 20);
  absl::Status s = CheckParseCost(flood, *PushRequest::descriptor());
  REQUIRE(s.code() == absl::StatusCode::kResourceExhausted);
  REQUIRE(s.message().find("asyncps.PushRequest of 4194304 bytes") !=
          std::string::npos);
  grpc::Slice slice(flood.data(), flood.size());
  const grpc::ByteBuffer buffer(&slice, 1);
  PushRequest parsed;
  s = ParseFromByteBuffer(buffer, &parsed);
  REQUIRE(s.code() == absl::StatusCode::kResourceExhausted);
  REQUIRE(parsed.grads_size() == 0);  // nothing parsed
  // No item costs more than 64 bytes per wire byte (unknown groups, the
  // dearest): requests under 256 KiB are not scanned.
  const std::string groups = Repeat("\x5b\x5c", 1 << 20);
  REQUIRE(EstimateParseCost(groups, *PushRequest::descriptor(),
                            int64_t{1} << 40) <= 64 * int64_t{groups.size()});
  REQUIRE(CheckParseCost(groups, *PushRequest::descriptor()).code() ==
          absl::StatusCode::kResourceExhausted);
  // Small floods stay under the 16 MiB that any request may take.
  REQUIRE(CheckParseCost(Repeat(std::string("\x1a\x00", 2), 64 << 10),
                         *PushRequest::descriptor())
              .ok());
  // A real 8 MiB push (128 slices of 64 KiB) parses.
  const std::string wire = RealPush("w", 128, 64 << 10).SerializeAsString();
  REQUIRE(CheckParseCost(wire, *PushRequest::descriptor()).ok());
  grpc::Slice whole(wire.data(), wire.size());
  REQUIRE(ParseFromByteBuffer(grpc::ByteBuffer(&whole, 1), &parsed).ok());
  REQUIRE(parsed.grads_size() == 128);
  // Malformed bytes still say they do not parse.
  grpc::Slice bad(
      "\x1a\xe8\x07"
      "abc",
      6);
  s = ParseFromByteBuffer(grpc::ByteBuffer(&bad, 1), &parsed);
  REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(s.message().find("does not parse") != std::string::npos);
}

}  // namespace
}  // namespace asyncps
