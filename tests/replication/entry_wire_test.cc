// A log entry on the Follow stream read back by a backup (ReadFeedWire):
// payloads of 16 KiB and more stay in the stream's slices, entries written
// with their payloads inside read the same, other messages parse whole,
// and bytes that are not a FollowFeed are refused, never half read.

#include "server/entry_wire.h"

#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/fast_frame.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/slices.h"

namespace asyncps {
namespace {

const std::string kSmall = std::string(300, 'x') + std::string(400, 'y');
const std::string kLarge(40000, 'r');  // shared: 16 KiB or more

// A push entry of index 7 with grads {kSmall, ""} and rows {kLarge} kept
// outside it, kSmall in two slices.
KeptEntry PushEntry() {
  auto feed = std::make_shared<FollowFeed>();
  LogEntry* entry = feed->mutable_entry();
  entry->set_index(7);
  entry->set_epoch(2);
  PushRequest* push = entry->mutable_push();
  push->set_request_id(41);
  push->set_wire_dtype(WIRE_F32);
  push->add_grads()->set_grad_bytes(kSmall.size());
  push->add_grads()->set_grad_bytes(0);
  push->add_rows()->set_table("emb");
  entry->add_evicted()->set_table("emb");
  auto payloads = std::make_shared<EntryPayloads>();
  payloads->grads.push_back(
      {grpc::Slice(kSmall.substr(0, 300)), grpc::Slice(kSmall.substr(300))});
  payloads->grads.push_back({});
  payloads->rows.push_back({grpc::Slice(kLarge)});
  return {std::move(feed), std::move(payloads)};
}

// The FollowFeed with the payloads inside, as protobuf would hold it.
FollowFeed Inside(const FollowFeed& feed, const EntryPayloads* payloads) {
  FollowFeed out = feed;
  if (payloads == nullptr) return out;
  for (const auto& g : payloads->grads) {
    out.mutable_entry()->add_grads(testing::JoinSlices(g));
  }
  for (const auto& r : payloads->rows) {
    out.mutable_entry()->add_rows(testing::JoinSlices(r));
  }
  return out;
}

grpc::ByteBuffer Bytes(const std::string& s) {
  grpc::Slice slice(s);
  return grpc::ByteBuffer(&slice, 1);
}

std::string Flatten(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  REQUIRE(b.Dump(&slices).ok());
  return testing::JoinSlices(slices);
}

TEST_CASE(
    "an entry read off the stream keeps payloads of 16 KiB and more in "
    "the stream's own slices, smaller ones copied, and goes out again as "
    "the same bytes",
    "[replication]") {
  const KeptEntry kept = PushEntry();
  grpc::ByteBuffer wire = EntryWire(kept);
  std::vector<grpc::Slice> sent;
  REQUIRE(wire.Dump(&sent).ok());
  FollowFeed feed;
  std::shared_ptr<const EntryPayloads> payloads;
  REQUIRE_OK(ReadFeedWire(&wire, &feed, &payloads));
  REQUIRE(payloads != nullptr);
  CHECK(feed.entry().grads_size() == 0);
  CHECK(feed.entry().rows_size() == 0);
  CHECK(feed.SerializeAsString() == kept.feed->SerializeAsString());
  REQUIRE(payloads->grads.size() == 2);
  REQUIRE(payloads->rows.size() == 1);
  CHECK(testing::JoinSlices(payloads->grads[0]) == kSmall);
  CHECK(testing::JoinSlices(payloads->grads[1]).empty());
  CHECK(testing::JoinSlices(payloads->rows[0]) == kLarge);
  CHECK(KeptBytes({std::make_shared<FollowFeed>(feed), payloads}) ==
        KeptBytes(kept));
  // The large payload is the very memory the stream brought; the small
  // one a copy in one slice.
  const grpc::Slice& large = kept.payloads->rows[0][0];
  REQUIRE(payloads->rows[0].size() == 1);
  CHECK(payloads->rows[0][0].begin() == large.begin());
  REQUIRE(payloads->grads[0].size() == 1);
  const grpc::Slice& small = payloads->grads[0][0];
  for (const grpc::Slice& s : sent) {
    CHECK_FALSE((s.begin() <= small.begin() && small.begin() < s.end()));
  }
  // Promoted, the backup feeds it on as the same bytes.
  CHECK(Flatten(EntryWire({std::make_shared<FollowFeed>(feed), payloads})) ==
        Flatten(EntryWire(kept)));
  // A view for the apply: the bytes, as floats.
  const Payload view = PayloadOf(payloads->rows[0], WIRE_F32);
  CHECK(view.size() == kLarge.size());
  CHECK(view.count() == kLarge.size() / 4);
}

TEST_CASE(
    "an entry serialized with its payloads inside reads as the same entry "
    "and payloads",
    "[replication]") {
  const KeptEntry kept = PushEntry();
  const FollowFeed inside = Inside(*kept.feed, kept.payloads.get());
  grpc::ByteBuffer wire = SerializeToByteBuffer(inside);
  FollowFeed feed;
  std::shared_ptr<const EntryPayloads> payloads;
  REQUIRE_OK(ReadFeedWire(&wire, &feed, &payloads));
  REQUIRE(payloads != nullptr);
  CHECK(Inside(feed, payloads.get()).SerializeAsString() ==
        inside.SerializeAsString());
  // An entry without payloads keeps none outside.
  FollowFeed heartbeat;
  heartbeat.mutable_entry()->set_index(3);
  heartbeat.mutable_entry()->mutable_heartbeat()->set_run_id("r");
  wire = SerializeToByteBuffer(heartbeat);
  REQUIRE_OK(ReadFeedWire(&wire, &feed, &payloads));
  CHECK(payloads == nullptr);
  CHECK(feed.SerializeAsString() == heartbeat.SerializeAsString());
}

TEST_CASE("a snapshot's pieces and its end read as plain messages",
          "[replication]") {
  FollowFeed piece;
  piece.mutable_file()->set_name("shard-0.ckpt");
  piece.mutable_file()->set_data(std::string(70000, 'c'));
  FollowFeed end;
  end.mutable_snapshot_end()->set_index(12);
  end.mutable_snapshot_end()->set_shard_epoch(4);
  for (const FollowFeed& m : {piece, end, FollowFeed()}) {
    grpc::ByteBuffer wire = SerializeToByteBuffer(m);
    FollowFeed feed;
    feed.mutable_entry()->set_index(99);  // replaced
    std::shared_ptr<const EntryPayloads> payloads;
    REQUIRE_OK(ReadFeedWire(&wire, &feed, &payloads));
    CHECK(payloads == nullptr);
    CHECK(feed.SerializeAsString() == m.SerializeAsString());
  }
}

TEST_CASE(
    "feed bytes cut short or mutated are refused, or read as protobuf "
    "reads them",
    "[replication][bad_input]") {
  const std::string whole = Flatten(EntryWire(PushEntry()));
  // Every cut of an entry leaves a length that runs past the bytes.
  for (size_t n = 1; n < whole.size(); n += (n < 200 ? 1 : 997)) {
    grpc::ByteBuffer wire = Bytes(whole.substr(0, n));
    FollowFeed feed;
    std::shared_ptr<const EntryPayloads> payloads;
    const absl::Status s = ReadFeedWire(&wire, &feed, &payloads);
    INFO("cut at " << n);
    CHECK(absl::IsInvalidArgument(s));
    CHECK(payloads == nullptr);
  }
  // An entry's length one byte short: its last field runs past it.
  FollowFeed small;
  small.mutable_entry()->set_index(5);
  small.mutable_entry()->mutable_heartbeat()->set_run_id("run");
  std::string bytes = small.SerializeAsString();
  REQUIRE(static_cast<uint8_t>(bytes[1]) == bytes.size() - 2);  // 1-byte length
  bytes[1] = static_cast<char>(bytes[1] - 1);
  {
    grpc::ByteBuffer wire = Bytes(bytes);
    FollowFeed feed;
    std::shared_ptr<const EntryPayloads> payloads;
    CHECK(absl::IsInvalidArgument(ReadFeedWire(&wire, &feed, &payloads)));
    CHECK_FALSE(feed.ParseFromString(bytes));  // as protobuf reads it
  }
  // Random bytes changed in the entry's head (where the tags and lengths
  // are): whatever reads must be what protobuf reads from the same bytes.
  std::mt19937 rng(43);
  const size_t head = whole.size() - kLarge.size();
  int read = 0, refused = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string bytes = whole;
    const int changes = 1 + static_cast<int>(rng() % 3);
    for (int c = 0; c < changes; ++c) {
      bytes[rng() % head] = static_cast<char>(rng());
    }
    grpc::ByteBuffer wire = Bytes(bytes);
    FollowFeed feed;
    std::shared_ptr<const EntryPayloads> payloads;
    if (!ReadFeedWire(&wire, &feed, &payloads).ok()) {
      ++refused;
      continue;
    }
    ++read;
    FollowFeed expected;
    INFO("mutation " << i);
    REQUIRE(expected.ParseFromString(bytes));
    CHECK(Inside(feed, payloads.get()).SerializeAsString() ==
          expected.SerializeAsString());
  }
  CHECK(read > 0);
  CHECK(refused > 0);
}

}  // namespace
}  // namespace asyncps
