// The replication log alone: order, acknowledgements by counted backups,
// fencing (also by the lease's end), continuing a backup from its last
// entry.

#include "server/replication_log.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/fast_frame.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/require_ok.h"

namespace asyncps {
namespace {

LogEntry Entry() {
  LogEntry e;
  e.mutable_heartbeat()->set_run_id("r");
  return e;
}

// The message that brings entry `e` to a backup.
KeptEntry Fed(const LogEntry& e) {
  auto feed = std::make_shared<FollowFeed>();
  *feed->mutable_entry() = e;
  return {std::move(feed), nullptr};
}

TEST_CASE(
    "entries are numbered in the order they ran; a backup refuses to run them",
    "[replication]") {
  ReplicationLog log({});
  std::vector<int> order;
  absl::StatusOr<uint64_t> refused =
      log.Run(Entry(), [&] { order.push_back(0); });
  CHECK(absl::IsUnavailable(refused.status()));
  CHECK(order.empty());
  log.BecomePrimary(5, {});
  log.AddReader(0);  // a feed from the start
  for (int i = 1; i <= 3; ++i) {
    absl::StatusOr<uint64_t> index =
        log.Run(Entry(), [&] { order.push_back(i); });
    REQUIRE_OK(index.status());
    CHECK(*index == static_cast<uint64_t>(i));
  }
  CHECK(order == std::vector<int>{1, 2, 3});
  CHECK(log.last_index() == 3);
  CHECK(log.last_epoch() == 5);
  absl::StatusOr<KeptEntry> second = log.Next(1, absl::ZeroDuration());
  REQUIRE_OK(second.status());
  REQUIRE(second->feed != nullptr);
  CHECK(second->feed->entry().index() == 2);
  CHECK(second->feed->entry().epoch() == 5);
  absl::StatusOr<KeptEntry> none = log.Next(3, absl::Milliseconds(1));
  REQUIRE_OK(none.status());
  CHECK(none->feed == nullptr);
}

TEST_CASE(
    "the append listener runs after each entry is appended and at the fence, "
    "outside the lock",
    "[replication]") {
  ReplicationLog log({});
  std::vector<uint64_t> seen;  // the last index each call could read
  log.SetAppendListener([&] { seen.push_back(log.last_index()); });
  log.BecomePrimary(1, {});
  REQUIRE_OK(log.Run(Entry(), [] {}).status());
  REQUIRE_OK(log.Run(Entry(), [] {}).status());
  CHECK(seen == std::vector<uint64_t>{1, 2});
  log.Fence(absl::UnavailableError("lease lost"));
  CHECK(seen == std::vector<uint64_t>{1, 2, 2});
  // A refused step appends nothing and calls nobody.
  CHECK(absl::IsUnavailable(log.Run(Entry(), [] {}).status()));
  CHECK(seen.size() == 3);
  log.SetAppendListener(nullptr);
  log.Resume(2);
  REQUIRE_OK(log.Run(Entry(), [] {}).status());
  CHECK(seen.size() == 3);
}

TEST_CASE("an answer waits for every counted backup, and only for those",
          "[replication]") {
  ReplicationLog log({});
  log.BecomePrimary(1, {"b1", "b2"});
  absl::StatusOr<uint64_t> index = log.Run(Entry(), [] {});
  REQUIRE_OK(index.status());
  int answered = 0;
  absl::Status answer = absl::UnknownError("not yet");
  log.WhenAcked(*index, [&](absl::Status s) {
    ++answered;
    answer = s;
  });
  log.Ack("b1", 1);
  CHECK(answered == 0);
  log.Ack("spare", 1);  // not counted: changes nothing
  CHECK(answered == 0);
  log.Ack("b2", 1);
  CHECK(answered == 1);
  CHECK(answer.ok());

  // Dropping a silent backup (a map change) releases what waited for it.
  index = log.Run(Entry(), [] {});
  REQUIRE_OK(index.status());
  answered = 0;
  log.WhenAcked(*index, [&](absl::Status s) {
    ++answered;
    answer = s;
  });
  log.Ack("b1", 2);
  CHECK(answered == 0);
  log.StopCounting("b2");
  CHECK(answered == 1);
  CHECK(answer.ok());
  // A counted spare is waited for from the index it was counted at.
  const uint64_t from = log.StartCounting("b3");
  CHECK(from == 2);
  index = log.Run(Entry(), [] {});
  answered = 0;
  log.WhenAcked(*index, [&](absl::Status) { ++answered; });
  log.Ack("b1", 3);
  CHECK(answered == 0);
  log.Ack("b3", 3);
  CHECK(answered == 1);
}

TEST_CASE("a fenced primary fails every waiting answer and runs nothing more",
          "[replication]") {
  ReplicationLog log({});
  log.BecomePrimary(1, {"b1"});
  absl::StatusOr<uint64_t> index = log.Run(Entry(), [] {});
  REQUIRE_OK(index.status());
  absl::Status answer;
  log.WhenAcked(*index, [&](absl::Status s) { answer = s; });
  log.Fence(absl::UnavailableError("lease lost"));
  CHECK(absl::IsUnavailable(answer));
  CHECK_FALSE(log.primary());
  bool ran = false;
  CHECK(absl::IsUnavailable(log.Run(Entry(), [&] { ran = true; }).status()));
  CHECK_FALSE(ran);
  // A late acknowledgement changes nothing.
  log.Ack("b1", 1);
  absl::Status late;
  log.WhenAcked(1, [&](absl::Status s) { late = s; });
  CHECK(absl::IsUnavailable(late));
}

TEST_CASE(
    "past its lease's certain end a primary answers nothing and runs nothing, "
    "before the keeper noticed",
    "[replication][lease]") {
  testing::FakeClock clock;
  ReplicationLog::Options o;
  o.clock = &clock;
  ReplicationLog log(o);
  log.BecomePrimary(1, {"b1"});
  log.HoldLeaseUntil(clock.Now() + absl::Seconds(1));
  absl::StatusOr<uint64_t> first = log.Run(Entry(), [] {});
  REQUIRE_OK(first.status());
  absl::Status answer = absl::UnknownError("not yet");
  log.WhenAcked(*first, [&](absl::Status s) { answer = s; });
  log.Ack("b1", 1);
  REQUIRE_OK(answer);  // within the lease
  absl::StatusOr<uint64_t> second = log.Run(Entry(), [] {});
  REQUIRE_OK(second.status());
  absl::Status waiting = absl::UnknownError("not yet");
  log.WhenAcked(*second, [&](absl::Status s) { waiting = s; });
  CHECK(absl::IsUnknown(waiting));
  // A renewal moves the end; then the lease runs out unrenewed.
  clock.Advance(absl::Milliseconds(900));
  log.HoldLeaseUntil(clock.Now() + absl::Seconds(1));
  clock.Advance(absl::Milliseconds(900));
  CHECK_FALSE(log.lapsed());
  clock.Advance(absl::Milliseconds(100));
  // The backup's acknowledgement comes after the end: not an answer OK.
  log.Ack("b1", 2);
  CHECK(absl::IsUnavailable(waiting));
  CHECK(absl::StrContains(waiting.message(), "lease"));
  CHECK(log.lapsed());
  CHECK(log.fenced());
  bool ran = false;
  CHECK(absl::IsUnavailable(log.Run(Entry(), [&] { ran = true; }).status()));
  CHECK_FALSE(ran);
  CHECK(log.last_index() == 2);
  // A new lease and the map's confirmation (ReplicaGroup::Rejoin).
  log.HoldLeaseUntil(clock.Now() + absl::Seconds(1));
  log.Resume(2);
  CHECK_FALSE(log.lapsed());
  absl::StatusOr<uint64_t> third = log.Run(Entry(), [] {});
  REQUIRE_OK(third.status());
  log.Ack("b1", 3);
  absl::Status resumed = absl::UnknownError("not yet");
  log.WhenAcked(*third, [&](absl::Status s) { resumed = s; });
  REQUIRE_OK(resumed);
}

TEST_CASE(
    "a backup's silence counts from the first entry it has not acknowledged, "
    "not from its last answer; a feed's end is noted until it follows again",
    "[replication]") {
  testing::FakeClock clock;
  ReplicationLog::Options o;
  o.clock = &clock;
  ReplicationLog log(o);
  log.BecomePrimary(1, {"b1", "b2"});
  REQUIRE_OK(log.Run(Entry(), [] {}).status());
  log.Ack("b1", 1);
  log.Ack("b2", 1);
  // Idle for 10 s, then an entry: neither backup has been silent yet.
  clock.Advance(absl::Seconds(10));
  const absl::Time appended = clock.Now();
  REQUIRE_OK(log.Run(Entry(), [] {}).status());
  clock.Advance(absl::Milliseconds(5));
  log.Ack("b1", 2);
  std::vector<ReplicationLog::BackupState> b = log.Backups();
  REQUIRE(b.size() == 2);
  CHECK(b[0].last_progress == clock.Now());  // b1 answered
  CHECK(b[1].acked == 1);
  CHECK(b[1].last_progress == appended);  // b2 silent since the entry
  // A further entry does not move b2's silence: it still owes entry 2.
  clock.Advance(absl::Seconds(1));
  REQUIRE_OK(log.Run(Entry(), [] {}).status());
  CHECK(log.Backups()[1].last_progress == appended);

  CHECK(log.Backups()[1].feed_ended == absl::InfiniteFuture());
  log.FeedEnded("b2");
  CHECK(log.Backups()[1].feed_ended == clock.Now());
  log.FeedStarted("b2");
  CHECK(log.Backups()[1].feed_ended == absl::InfiniteFuture());
  log.FeedEnded("b2");
  log.Ack("b2", 3);  // following again
  CHECK(log.Backups()[1].feed_ended == absl::InfiniteFuture());
  // A backup the log does not track stays untracked.
  log.FeedEnded("gone");
  log.FeedStarted("gone");
  CHECK(log.Backups().size() == 2);
}

TEST_CASE("a primary nobody follows answers at once, within its lease only",
          "[replication][lease]") {
  testing::FakeClock clock;
  ReplicationLog::Options o;
  o.clock = &clock;
  ReplicationLog log(o);
  log.BecomePrimary(1, {});
  log.HoldLeaseUntil(clock.Now() + absl::Seconds(1));
  absl::StatusOr<uint64_t> index = log.Run(Entry(), [] {});
  REQUIRE_OK(index.status());
  clock.Advance(absl::Seconds(1));
  // Run before the end; its answer is due after it.
  absl::Status answer;
  log.WhenAcked(*index, [&](absl::Status s) { answer = s; });
  CHECK(absl::IsUnavailable(answer));
  CHECK(log.lapsed());
}

TEST_CASE("a backup continues from its last entry only when the log holds it",
          "[replication]") {
  ReplicationLog backup({});
  backup.ResetTo(10, 3);  // restored from a snapshot taken after entry 10
  LogEntry e = Entry();
  e.set_index(12);
  e.set_epoch(3);
  CHECK(absl::IsFailedPrecondition(backup.Append(Fed(e), [] {})));
  for (uint64_t i = 11; i <= 13; ++i) {
    e.set_index(i);
    e.set_epoch(i < 13 ? 3 : 4);
    int applied = 0;
    REQUIRE_OK(backup.Append(Fed(e), [&] { ++applied; }));
    CHECK(applied == 1);
  }
  CHECK(backup.CanContinue(11, 3));
  CHECK(backup.CanContinue(13, 4));
  CHECK_FALSE(backup.CanContinue(12, 4));  // diverged: another entry there
  CHECK_FALSE(backup.CanContinue(14, 4));  // ahead of this log
  CHECK_FALSE(backup.CanContinue(0, 0));   // holds nothing: snapshot
  CHECK_FALSE(backup.CanContinue(9, 3));   // before what is kept

  // Promoted, it numbers on after its last entry with its own epoch.
  backup.BecomePrimary(7, {});
  absl::StatusOr<uint64_t> index = backup.Run(Entry(), [] {});
  REQUIRE_OK(index.status());
  CHECK(*index == 14);
  CHECK(backup.last_epoch() == 7);
}

TEST_CASE("old entries are dropped past the size bound", "[replication]") {
  ReplicationLog::Options o;
  o.max_bytes = 1000;
  ReplicationLog log(o);
  log.BecomePrimary(1, {"b1"});
  for (int i = 0; i < 100; ++i) {
    LogEntry e = Entry();
    e.add_grads(std::string(100, 'x'));
    REQUIRE_OK(log.Run(std::move(e), [] {}).status());
  }
  CHECK(absl::IsOutOfRange(log.Next(1, absl::ZeroDuration()).status()));
  absl::StatusOr<KeptEntry> last = log.Next(99, absl::ZeroDuration());
  REQUIRE_OK(last.status());
  CHECK(last->feed->entry().index() == 100);
}

TEST_CASE(
    "entries a feed has yet to send are kept past the size bound, up to the "
    "bound for unsent entries",
    "[replication]") {
  ReplicationLog::Options o;
  o.max_bytes = 1000;
  o.max_unsent_bytes = 6000;  // more than 4x max_bytes
  ReplicationLog log(o);
  log.BecomePrimary(1, {"b1"});
  const uint64_t reader = log.AddReader(0);  // a spare: sent nothing yet
  const auto run = [&](int n) {
    for (int i = 0; i < n; ++i) {
      LogEntry e = Entry();
      e.add_grads(std::string(100, 'x'));
      REQUIRE_OK(log.Run(std::move(e), [] {}).status());
    }
  };
  // About 4,500 bytes: past 4x max_bytes, under max_unsent_bytes.
  run(40);
  CHECK(log.stats().kept_entries == 40);
  CHECK(log.stats().kept_bytes > 4 * o.max_bytes);
  REQUIRE_OK(log.Next(0, absl::ZeroDuration()).status());
  // Past max_unsent_bytes the oldest go, needed or not.
  run(60);
  CHECK(absl::IsOutOfRange(log.Next(0, absl::ZeroDuration()).status()));
  CHECK(log.stats().kept_bytes <= o.max_unsent_bytes);
  CHECK(log.stats().kept_bytes > o.max_unsent_bytes - 200);
  // Nobody waits for them any more: back under max_bytes at the next entry.
  log.RemoveReader(reader);
  run(1);
  CHECK(log.stats().kept_bytes <= o.max_bytes);
  CHECK(log.stats().kept_entries >= 1);
}

TEST_CASE(
    "a primary nobody follows makes and keeps no entry; a follower that "
    "comes gets every entry from then on",
    "[replication]") {
  ReplicationLog log({});
  log.BecomePrimary(1, {});
  int made = 0;
  const auto make = [&] {
    ++made;
    return Entry();
  };
  int evicted_into_scratch = 0;
  for (int i = 0; i < 3; ++i) {
    REQUIRE_OK(log.Run(make,
                       [&](LogEntry* e) {
                         e->add_evicted()->set_table("t");
                         ++evicted_into_scratch;
                       })
                   .status());
  }
  CHECK(made == 0);
  CHECK(evicted_into_scratch == 3);
  CHECK(log.last_index() == 3);
  CHECK(absl::IsOutOfRange(log.Next(1, absl::ZeroDuration()).status()));
  // An entry made already still reaches `apply` (a slot move's step reads
  // its own entry).
  LogEntry given = Entry();
  given.mutable_heartbeat()->set_run_id("given");
  std::string seen;
  REQUIRE_OK(log.Run(std::move(given),
                     [&](LogEntry* e) { seen = e->heartbeat().run_id(); })
                 .status());
  CHECK(seen == "given");

  // A feed from entry 4 on: entries are made and kept again.
  const uint64_t reader = log.AddReader(log.last_index());
  REQUIRE_OK(log.Run(make, [](LogEntry*) {}).status());
  CHECK(made == 1);
  absl::StatusOr<KeptEntry> fifth = log.Next(4, absl::ZeroDuration());
  REQUIRE_OK(fifth.status());
  REQUIRE(fifth->feed != nullptr);
  CHECK(fifth->feed->entry().index() == 5);
  CHECK(fifth->feed->entry().heartbeat().run_id() == "r");
  log.RemoveReader(reader);
  REQUIRE_OK(log.Run(make, [](LogEntry*) {}).status());
  CHECK(made == 1);
  // A backup (a spare's acknowledgement) is a follower too.
  log.Ack("spare", 6);
  REQUIRE_OK(log.Run(make, [](LogEntry*) {}).status());
  CHECK(made == 2);
  REQUIRE_OK(log.Next(6, absl::ZeroDuration()).status());
  // A backup that knew entry 3 cannot continue: it needs a snapshot.
  CHECK_FALSE(log.CanContinue(3, 1));
}

TEST_CASE(
    "an entry whose payloads are kept outside it goes out as the same "
    "FollowFeed as one that holds them",
    "[replication]") {
  ReplicationLog log({});
  log.BecomePrimary(3, {});
  const uint64_t reader = log.AddReader(0);
  LogEntry header;
  PushRequest* push = header.mutable_push();
  push->set_request_id(41);
  push->add_grads()->set_grad_bytes(700);
  push->add_grads()->set_grad_bytes(0);
  push->add_rows()->set_table("emb");
  const std::string g0 = std::string(300, 'x') + std::string(400, 'y');
  const std::string r0(20000, 'r');  // a length of three varint bytes
  auto payloads = std::make_shared<EntryPayloads>();
  payloads->grads.push_back(
      {grpc::Slice(g0.substr(0, 300)), grpc::Slice(g0.substr(300))});
  payloads->grads.push_back({});  // an empty payload
  payloads->rows.push_back({grpc::Slice(r0)});
  REQUIRE_OK(log.Run([&] { return MadeEntry(header, payloads); },
                     [](LogEntry* e) { e->add_evicted()->set_table("emb"); })
                 .status());
  absl::StatusOr<KeptEntry> kept = log.Next(0, absl::ZeroDuration());
  REQUIRE_OK(kept.status());
  REQUIRE(kept->feed != nullptr);
  CHECK(kept->feed->entry().grads_size() == 0);  // not copied in

  FollowFeed sent;
  REQUIRE_OK(ParseFromByteBuffer(EntryWire(*kept), &sent));
  // The same entry with its payloads inside, as a backup keeps it.
  FollowFeed inside = *kept->feed;
  inside.mutable_entry()->add_grads(g0);
  inside.mutable_entry()->add_grads("");
  inside.mutable_entry()->add_rows(r0);
  CHECK(sent.entry().index() == 1);
  CHECK(sent.entry().epoch() == 3);
  CHECK(sent.entry().evicted_size() == 1);
  REQUIRE(sent.entry().grads_size() == 2);
  CHECK(sent.entry().grads(0) == g0);
  CHECK(sent.SerializeAsString() == inside.SerializeAsString());
  // A kept entry without outside payloads goes out as serialized.
  FollowFeed plain;
  REQUIRE_OK(ParseFromByteBuffer(EntryWire({kept->feed, nullptr}), &plain));
  CHECK(plain.SerializeAsString() == kept->feed->SerializeAsString());
  log.RemoveReader(reader);
}

}  // namespace
}  // namespace asyncps
