// One map change at a time, on real ps_server shards (separate processes
// on port 0): two moves planned from the same map that share no shard
// (psctl run twice, a scaler beside an operator) must not both commit the
// run's next epoch with different maps, which left every client stopped
// ("shard 0 serves the map of epoch 2 but shard 1 another"). A move whose
// source holds its copy (a stand-in SlotMoves service) keeps the epoch;
// the other move is refused with the map unchanged, goes through once the
// first ended, and the first, planned again from the old map, is refused.
// The run's map record lives at the keeper shard the moves name (psctl:
// shard 0), or in etcd for a run with --etcd_endpoints, whatever keeper a
// move names; psctl status shows it. The keeper's record refuses bad
// writes and other runs.
#include <signal.h>

#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/map_change.h"
#include "common/net.h"
#include "common/shard_map.h"
#include "common/shard_map_proto.h"
#include "membership/etcd_client.h"
#include "membership/map_store.h"
#include "proto/asyncps.grpc.pb.h"
#include "proto/slot_moves.grpc.pb.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/slot_moves.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

using testing::MoveSlots;
using testing::ServerProcess;

constexpr int kShards = 4;
constexpr int kSlots = 16;

// A source whose first copy round waits until released, then fails: the
// move it serves stays in its copy for as long as the test wants.
class HeldSource final : public SlotMoves::Service {
 public:
  grpc::Status ExportSlots(
      grpc::ServerContext* /*ctx*/, const ExportSlotsRequest* /*request*/,
      grpc::ServerWriter<ExportSlotsChunk>* /*out*/) override {
    release_.WaitForNotificationWithTimeout(absl::Seconds(60));
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the source went away");
  }
  void Release() {
    if (!release_.HasBeenNotified()) release_.Notify();
  }

 private:
  absl::Notification release_;
};

// The move of `next` into `destination` from a HeldSource standing in for
// shard 0, on its own thread: it stays in its first copy round until End,
// then fails (UNAVAILABLE). The destructor ends it too (a failed REQUIRE).
class HeldMove {
 public:
  HeldMove(const std::string& destination, const ShardMap& next,
           const std::string& keeper) {
    int port = 0;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(&source_);
    server_ = builder.BuildAndStart();
    REQUIRE(port > 0);
    const std::string source = absl::StrCat("127.0.0.1:", port);
    thread_ = std::thread([this, destination, source, next, keeper] {
      result_ = MoveSlots(destination, source, 0, next, nullptr, keeper);
    });
  }
  ~HeldMove() {
    End();
    server_->Shutdown();
  }

  // Lets the source fail; the move's answer.
  grpc::Status End() {
    source_.Release();
    if (thread_.joinable()) thread_.join();
    return result_;
  }

 private:
  HeldSource source_;
  std::unique_ptr<grpc::Server> server_;
  grpc::Status result_;
  std::thread thread_;
};

absl::StatusOr<VersionedMapRecord> KeeperRecord(const std::string& keeper,
                                                const std::string& run) {
  ReadMapRecordRequest request;
  request.set_run_id(run);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  VersionedMapRecord out;
  const grpc::Status s = SlotMoves::NewStub(MakeChannel(keeper))
                             ->ReadMapRecord(&ctx, request, &out);
  if (!s.ok()) return absl::UnknownError(s.error_message());
  return out;
}

uint64_t ServedEpoch(const std::string& address) {
  StatusRequest status;
  auto stub = ParameterServer::NewStub(MakeChannel(address));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  StatusResponse r;
  const grpc::Status s = stub->Status(&ctx, status, &r);
  INFO(s.error_message());
  REQUIRE(s.ok());
  return r.map().epoch();
}

// The scenario on `cluster`; `record` reads the run's map record; moves
// name `keeper_a` and `keeper_b` as their keepers.
// `psctl_where` are psctl's flags to find the shards; its status must name
// the move that holds the record, and then the record's epoch.
void TwoMovesFromOneMap(
    const std::vector<ServerProcess>& cluster, const std::string& keeper_a,
    const std::string& keeper_b,
    const std::function<absl::StatusOr<MapRecord>()>& record,
    const std::vector<std::string>& psctl_where) {
  const auto served = [&] {
    std::set<uint64_t> epochs;
    for (const ServerProcess& p : cluster) {
      epochs.insert(ServedEpoch(p.address));
    }
    return epochs;
  };
  const auto status_line = [&] {
    std::vector<std::string> args = {"status"};
    args.insert(args.end(), psctl_where.begin(), psctl_where.end());
    const std::set<uint64_t> before = served();
    absl::StatusOr<testing::ToolRun> run =
        testing::RunTool("tools/psctl", args);
    REQUIRE_OK(run.status());
    INFO(run->output);
    // Only the shards of a move adopt its map here (nobody hands it to the
    // others): a cluster at two epochs is a warning, and exit status 1.
    // (With etcd the others adopt the run's map within 5 s by themselves:
    // judged when no shard changed its map meanwhile.)
    if (served() == before) {
      CHECK(run->exit_code == (before.size() == 1 ? 0 : 1));
      CHECK(absl::StrContains(run->output, "serve different maps") ==
            (before.size() > 1));
    }
    const size_t at = run->output.find("map record (");
    REQUIRE(at != std::string::npos);
    return run->output.substr(at, run->output.find('\n', at) - at);
  };
  const ShardMap even = *ShardMap::EvenSlots(kShards, kSlots);
  // A: slots 0 and 4 of shard 0 to shard 1 (from the held stand-in for
  // shard 0); B: slots 2 and 6 of shard 2 to shard 3. No shard in common.
  const ShardMap a = *WithSlotsMoved(even, {0, 4}, 1);
  const ShardMap b = *WithSlotsMoved(even, {2, 6}, 3);
  REQUIRE(a.epoch() == b.epoch());
  HeldMove first(cluster[1].address, a, keeper_a);
  // Until A holds the run's next epoch.
  REQUIRE_OK(testing::WaitFor(
      [&] {
        absl::StatusOr<MapRecord> r = record();
        return r.ok() && r->has_pending() &&
               r->pending().destination_index() == 1;
      },
      absl::Seconds(20), "the first move to take the epoch"));
  const std::string held_line = status_line();
  CHECK(absl::StrContains(held_line, "a move holds epoch 2: shard 1 (" +
                                         cluster[1].address +
                                         ") moving 2 slots in from shard 0"));
  const grpc::Status refused = MoveSlots(cluster[3].address, cluster[2].address,
                                         2, b, nullptr, keeper_b);
  INFO(refused.error_message());
  REQUIRE(refused.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(absl::StrContains(refused.error_message(), "another map change"));
  CHECK(absl::StrContains(refused.error_message(), "shard 1"));
  for (const ServerProcess& s : cluster) CHECK(ServedEpoch(s.address) == 1);

  // The first move ends (aborted: its source went away); the record is
  // free again and B goes through.
  const grpc::Status a_result = first.End();
  INFO(a_result.error_message());
  REQUIRE(a_result.error_code() == grpc::StatusCode::UNAVAILABLE);
  REQUIRE_OK(testing::WaitFor(
      [&] {
        absl::StatusOr<MapRecord> r = record();
        return r.ok() && !r->has_pending();
      },
      absl::Seconds(10), "the aborted move to give the epoch back"));
  const grpc::Status moved = MoveSlots(cluster[3].address, cluster[2].address,
                                       2, b, nullptr, keeper_b);
  INFO(moved.error_message());
  REQUIRE(moved.ok());
  absl::StatusOr<MapRecord> after = record();
  REQUIRE_OK(after.status());
  CHECK(!after->has_pending());
  REQUIRE(after->committed().epoch() == 2);
  CHECK(*ShardMapFromProto(after->committed()) == b);
  CHECK(ServedEpoch(cluster[3].address) == 2);
  CHECK(ServedEpoch(cluster[1].address) == 1);
  CHECK(absl::StrContains(status_line(), "epoch 2; no move in progress"));

  // A again, from the real shard 0 but still planned from epoch 1: refused,
  // nothing moved.
  const grpc::Status old = MoveSlots(cluster[1].address, cluster[0].address, 0,
                                     a, nullptr, keeper_a);
  INFO(old.error_message());
  REQUIRE(old.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(absl::StrContains(old.error_message(), "at epoch 2 already"));
  CHECK(ServedEpoch(cluster[1].address) == 1);
}

TEST_CASE(
    "two moves planned from one map: the keeper shard lets one commit the "
    "next epoch and refuses the other",
    "[slots][moves][keeper]") {
  auto cluster = testing::StartPsCluster(
      kShards, {absl::StrCat("--num_slots=", kSlots), "--run_id=keep"});
  REQUIRE_OK(cluster.status());
  const std::string keeper = (*cluster)[0].address;
  TwoMovesFromOneMap(*cluster, keeper, keeper,
                     [&]() -> absl::StatusOr<MapRecord> {
                       absl::StatusOr<VersionedMapRecord> r =
                           KeeperRecord(keeper, "keep");
                       if (!r.ok()) return r.status();
                       return r->record();
                     },
                     {"--servers=" + testing::ServerList(*cluster)});

  // The keeper's record: another run's id, and writes that are not a
  // record, change nothing.
  const absl::StatusOr<VersionedMapRecord> before =
      KeeperRecord(keeper, "keep");
  REQUIRE_OK(before.status());
  auto stub = SlotMoves::NewStub(MakeChannel(keeper));
  {
    grpc::ClientContext ctx;
    ReadMapRecordRequest other;
    other.set_run_id("another-run");
    VersionedMapRecord out;
    const grpc::Status s = stub->ReadMapRecord(&ctx, other, &out);
    CHECK(s.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  }
  for (int bad = 0; bad < 3; ++bad) {
    SwapMapRecordRequest request;
    request.set_run_id("keep");
    request.set_expected_version(before->version());
    if (bad == 0) request.mutable_record()->mutable_committed()->set_epoch(3);
    if (bad == 1) {
      ShardMapToProto(
          *ShardMap::EvenSlots(kShards, kSlots),
          request.mutable_record()->mutable_pending()->mutable_next_map());
      request.mutable_record()->mutable_pending()->set_destination_index(9);
    }
    if (bad == 2) request.set_run_id("another-run");
    grpc::ClientContext ctx;
    SwapMapRecordResponse out;
    const grpc::Status s = stub->SwapMapRecord(&ctx, request, &out);
    INFO(bad << ": " << s.error_message());
    CHECK(s.error_code() == (bad == 2 ? grpc::StatusCode::FAILED_PRECONDITION
                                      : grpc::StatusCode::INVALID_ARGUMENT));
  }
  const absl::StatusOr<VersionedMapRecord> unchanged =
      KeeperRecord(keeper, "keep");
  REQUIRE_OK(unchanged.status());
  CHECK(unchanged->version() == before->version());
  CHECK(unchanged->record().committed().epoch() == 2);
}

TEST_CASE(
    "two moves planned from one map in a run with etcd: the record lives in "
    "etcd whatever keeper a move names",
    "[slots][moves][keeper][etcd]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  auto cluster = testing::StartPsCluster(
      kShards,
      {absl::StrCat("--num_slots=", kSlots), "--run_id=etcd-keep",
       absl::StrCat("--etcd_endpoints=", etcd->endpoint), "--host=127.0.0.1"});
  REQUIRE_OK(cluster.status());
  EtcdClientOptions eo;
  eo.endpoints = {etcd->endpoint};
  std::unique_ptr<EtcdClient> client = EtcdClient::Connect(eo).value();
  const std::string key = RunPrefix("etcd-keep") + "/slots";
  // Each move names another keeper (or none): the record is etcd's.
  TwoMovesFromOneMap(
      *cluster, "", (*cluster)[2].address,
      [&]() -> absl::StatusOr<MapRecord> {
        absl::StatusOr<std::optional<EtcdKeyValue>> kv = client->Get(key);
        if (!kv.ok()) return kv.status();
        MapRecord r;
        if (kv->has_value() && !r.ParseFromString((*kv)->value)) {
          return absl::DataLossError("does not parse");
        }
        return r;
      },
      {absl::StrCat("--etcd_endpoints=", etcd->endpoint),
       "--run_id=etcd-keep"});
  // No shard kept a record of its own.
  for (const ServerProcess& s : *cluster) {
    absl::StatusOr<VersionedMapRecord> own =
        KeeperRecord(s.address, "etcd-keep");
    REQUIRE_OK(own.status());
    CHECK(own->version() == 0);
  }
  // The shards that took no part in the move, whom nobody handed its map
  // and no request reaches, adopt the record's map by themselves (they
  // look at it every 5 s).
  for (const ServerProcess& s : *cluster) {
    REQUIRE_OK(testing::WaitFor(
        [&] { return ServedEpoch(s.address) == 2; }, absl::Seconds(15),
        absl::StrCat(s.address, " at epoch 2"), absl::Milliseconds(100)));
  }
}

TEST_CASE(
    "a keeper shard killed and restarted on its files still knows the move "
    "that holds the epoch",
    "[slots][moves][keeper][restart]") {
  std::vector<std::string> dirs;
  std::vector<ServerProcess> cluster;
  const auto args = [&](int i) {
    return std::vector<std::string>{absl::StrCat("--num_slots=", kSlots),
                                    "--run_id=keep-restart",
                                    "--checkpoint_dir=" + dirs[i]};
  };
  for (int i = 0; i < kShards; ++i) {
    dirs.push_back(testing::MakeTmpDir(absl::StrCat("keeper-", i)));
    absl::StatusOr<ServerProcess> s =
        testing::StartPsServer(i, kShards, args(i));
    REQUIRE_OK(s.status());
    cluster.push_back(*std::move(s));
  }
  const std::string keeper = cluster[0].address;
  const ShardMap even = *ShardMap::EvenSlots(kShards, kSlots);
  const ShardMap a = *WithSlotsMoved(even, {0, 4}, 1);
  const ShardMap b = *WithSlotsMoved(even, {2, 6}, 3);
  HeldMove first(cluster[1].address, a, keeper);
  REQUIRE_OK(testing::WaitFor(
      [&] {
        absl::StatusOr<VersionedMapRecord> r =
            KeeperRecord(keeper, "keep-restart");
        return r.ok() && r->record().has_pending();
      },
      absl::Seconds(20), "the first move to take the epoch"));

  // The keeper dies and comes back on its port and files.
  REQUIRE(cluster[0].process->Signal(SIGKILL).ok());
  (void)cluster[0].process->Wait(absl::Seconds(10));
  const int port = std::stoi(keeper.substr(keeper.rfind(':') + 1));
  absl::StatusOr<ServerProcess> restarted =
      testing::StartPsServer(0, kShards, args(0), absl::Seconds(30), port);
  REQUIRE_OK(restarted.status());
  cluster[0] = *std::move(restarted);

  const grpc::Status refused =
      MoveSlots(cluster[3].address, cluster[2].address, 2, b, nullptr, keeper);
  INFO(refused.error_message());
  REQUIRE(refused.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(absl::StrContains(refused.error_message(), "another map change"));

  first.End();
  const grpc::Status moved =
      MoveSlots(cluster[3].address, cluster[2].address, 2, b, nullptr, keeper);
  INFO(moved.error_message());
  CHECK(moved.ok());
}

}  // namespace
}  // namespace asyncps
