// psctl scale on real ps_server processes while a worker trains: a run of
// four shard processes starts with two owning the slots (ps_server
// --serving_shards) and the other two stopped, grows to three and four as
// fresh processes start where the worker looks for them, shrinks back to
// two, and the drained processes stop with exit status 0; the worker never
// sees an error, and the exact ledger (tests/integration/ledger_trainer.h)
// shows every acknowledged push applied once. Bad scales are refused and
// change nothing.
#include <signal.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/ps_client.h"
#include "common/net.h"
#include "common/shard_map.h"
#include "common/shard_map_proto.h"
#include "proto/asyncps.grpc.pb.h"
#include "tests/integration/ledger_trainer.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

using testing::ConnectClient;
using testing::LedgerTrainer;
using testing::LedgerWrong;
using testing::Psctl;
using testing::ServerProcess;
using testing::StartPsServer;

constexpr int kProcesses = 4;
const std::vector<std::string> kFlags = {"--num_slots=64",
                                         "--serving_shards=2"};

// Stops shard `s` with SIGTERM and checks that it exits 0.
void StopShard(std::vector<ServerProcess>* cluster, int s) {
  ServerProcess& p = (*cluster)[s];
  REQUIRE_OK(p.process->Signal(SIGTERM));
  absl::StatusOr<int> code = p.process->Wait(absl::Seconds(30));
  INFO(p.process->LogTail());
  REQUIRE_OK(code.status());
  CHECK(*code == 0);
}

// Starts shard `s` as a fresh process (no files) where it was.
void StartShard(std::vector<ServerProcess>* cluster, int s) {
  const std::string& address = (*cluster)[s].address;
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  absl::StatusOr<ServerProcess> p =
      StartPsServer(s, kProcesses, kFlags, absl::Seconds(30), port);
  REQUIRE_OK(p.status());
  (*cluster)[s] = *std::move(p);
}

TEST_CASE(
    "a run grows from 2 to 3 to 4 shard processes and shrinks back to 2 "
    "while a worker trains, with no error and every acknowledged push "
    "applied once",
    "[slots][scale][ledger]") {
  std::vector<ServerProcess> cluster;
  std::vector<std::string> addresses;
  for (int s = 0; s < kProcesses; ++s) {
    absl::StatusOr<ServerProcess> p = StartPsServer(s, kProcesses, kFlags);
    REQUIRE_OK(p.status());
    addresses.push_back(p->address);
    cluster.push_back(*std::move(p));
  }
  const std::string servers = "--servers=" + testing::ServerList(cluster);
  // Shards 2 and 3 own no slot: they may be stopped, and the worker starts
  // without them.
  StopShard(&cluster, 2);
  StopShard(&cluster, 3);
  std::unique_ptr<PsClient> c = ConnectClient(addresses);
  CHECK(c->map().serving_shards() == std::vector<int>{0, 1});
  LedgerTrainer t;
  t.Start(c.get());

  // Slots go only to a shard that answers.
  const auto [down, down_out] = Psctl({"scale", servers, "--shards=3"});
  INFO(down_out);
  CHECK(down == 1);
  CHECK(absl::StrContains(down_out, "shard 2"));

  StartShard(&cluster, 2);
  StartShard(&cluster, 3);
  // A reader that learns the map of 4 shards and then stays idle.
  std::unique_ptr<PsClient> idle;
  for (const int m : {3, 4, 2}) {
    const int64_t before = t.acked.load();
    const auto [code, out] =
        Psctl({"scale", servers, absl::StrCat("--shards=", m)});
    INFO("scale to " << m << ": " << out);
    CHECK(code == 0);
    t.WaitForPushes(before, 10);
    CHECK(t.acked.load() >= before + 10);
    if (m == 4) {  // a reader (as ps_serve): it registers no worker
      PsClientOptions o;
      o.servers = addresses;
      o.reader = true;
      // Retried until this deadline, a part would fail the read below.
      o.retry.call_deadline = absl::Seconds(20);
      idle = PsClient::Connect(o).value();
      REQUIRE_OK(idle->WaitForShards(absl::Seconds(30)));
      REQUIRE_OK(idle->WaitForTensors({"emb", "w"}, absl::Seconds(30)));
      CHECK(idle->map().serving_shards().size() == 4);
    }
  }
  // Drained: shards 2 and 3 stop; the worker goes on with 0 and 1.
  StopShard(&cluster, 2);
  StopShard(&cluster, 3);
  {
    // Stopped shards that own no slot are no fault of the run.
    const auto [code, out] = Psctl({"status", servers});
    INFO(out);
    CHECK(code == 0);
    CHECK(absl::StrContains(out, "owns no slot (psctl scale)"));
  }
  const int64_t before = t.acked.load();
  t.WaitForPushes(before, 20);
  t.Stop();
  REQUIRE_OK(t.error);
  CHECK(t.stale == 0);
  CHECK(t.acked.load() >= before + 20);
  CHECK(c->map().serving_shards() == std::vector<int>{0, 1});
  CHECK(c->map().epoch() >= 5);

  // The ledger, read by the idle reader: it still routes by the map of 4
  // shards, two of them stopped; shards 0 and 1 refuse its pull with the
  // map of 2, and the parts for the stopped shards are routed again by it
  // instead of retried until the deadline (20 s: the pull would fail).
  c.reset();
  INFO("acknowledged pushes " << t.acked.load());
  CHECK(LedgerWrong(idle.get(), t.ids, t.acked.load()) == 0);
  CHECK(idle->map().serving_shards() == std::vector<int>{0, 1});
  // And a client that starts now, without shards 2 and 3.
  std::unique_ptr<PsClient> reader = ConnectClient(addresses);
  REQUIRE_OK(reader->WaitForTensors({"emb", "w"}, absl::Seconds(30)));
  CHECK(LedgerWrong(reader.get(), t.ids, t.acked.load()) == 0);
}

// Shard `p`'s Status (5 s deadline).
absl::StatusOr<StatusResponse> Status(const ServerProcess& p) {
  auto stub = ParameterServer::NewStub(MakeChannel(p.address));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  StatusResponse response;
  const grpc::Status s = stub->Status(&ctx, StatusRequest(), &response);
  if (!s.ok()) return absl::UnavailableError(s.error_message());
  return response;
}

// The shards that own slots under the map shard 0 serves (empty when it
// does not answer).
std::vector<int> Serving(const std::vector<ServerProcess>& cluster) {
  absl::StatusOr<StatusResponse> st = Status(cluster[0]);
  if (!st.ok()) return {};
  absl::StatusOr<ShardMap> map = ShardMapFromProto(st->map());
  return map.ok() ? map->serving_shards() : std::vector<int>{};
}

// A reader's pull routed by map epoch `epoch` at shard `p`: its status.
grpc::StatusCode PullRoutedBy(const ServerProcess& p, uint64_t epoch) {
  auto stub = ParameterServer::NewStub(MakeChannel(p.address));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  PullRequest request;
  request.set_read_only(true);
  request.set_map_epoch(epoch);
  PullResponse response;
  return stub->Pull(&ctx, request, &response).error_code();
}

void WaitForServing(const std::vector<ServerProcess>& cluster,
                    const std::vector<int>& serving) {
  REQUIRE_OK(testing::WaitFor([&] { return Serving(cluster) == serving; },
                              absl::Seconds(30),
                              absl::StrCat(serving.size(), " serving shards")));
}

TEST_CASE(
    "psctl scale --watch grows the run onto the shard processes that come "
    "up, never onto drained ones, and never shrinks it",
    "[slots][scale]") {
  std::vector<ServerProcess> cluster;
  for (int s = 0; s < kProcesses; ++s) {
    absl::StatusOr<ServerProcess> p = StartPsServer(s, kProcesses, kFlags);
    REQUIRE_OK(p.status());
    cluster.push_back(*std::move(p));
  }
  const std::string servers = "--servers=" + testing::ServerList(cluster);
  StopShard(&cluster, 2);
  StopShard(&cluster, 3);
  absl::StatusOr<std::unique_ptr<testing::Subprocess>> follower =
      testing::Subprocess::Start(
          testing::RunfilePath("tools/psctl"),
          {"scale", servers, "--watch=300ms", "--timeout=2s"});
  REQUIRE_OK(follower.status());
  // Shards 2 and 3 are down: nothing moves.
  absl::SleepFor(absl::Seconds(1));
  CHECK(Serving(cluster) == std::vector<int>{0, 1});
  StartShard(&cluster, 2);
  WaitForServing(cluster, {0, 1, 2});

  // A scale down (a pod's preStop hook on Kubernetes) drains shard 2: the
  // follower leaves it out while it runs on, and shard 3 beyond it. The
  // follower may still be finishing its own change (the map epoch after
  // shard 2's slots flipped); a change racing it is refused with the map
  // unchanged, and is run again, as an operator or a hook would.
  std::pair<int, std::string> scaled;
  const absl::Status down = testing::WaitFor(
      [&] {
        scaled = Psctl({"scale", servers, "--shards=2"});
        return scaled.first == 0;
      },
      absl::Seconds(60), "psctl scale --shards=2 to succeed",
      absl::Milliseconds(200));
  INFO(scaled.second);
  REQUIRE_OK(down);
  absl::StatusOr<StatusResponse> drained = Status(cluster[2]);
  REQUIRE_OK(drained.status());
  CHECK(drained->drained());
  StartShard(&cluster, 3);
  absl::SleepFor(absl::Seconds(2));
  CHECK(Serving(cluster) == std::vector<int>{0, 1});

  // Stopped, the drained shard still answers calls routed by the map that
  // gave it slots (the map to route by: FAILED_PRECONDITION), and exits
  // once none came for a second.
  const uint64_t gave = drained->map().epoch() - 1;
  // Counted (Status, /metrics).
  CHECK(PullRoutedBy(cluster[2], gave) ==
        grpc::StatusCode::FAILED_PRECONDITION);
  absl::StatusOr<StatusResponse> counted = Status(cluster[2]);
  REQUIRE_OK(counted.status());
  CHECK(counted->counters().misrouted_calls() ==
        drained->counters().misrouted_calls() + 1);
  REQUIRE(cluster[2].process->Signal(SIGTERM).ok());
  int answered = 0;
  for (int i = 0; i < 8; ++i) {
    absl::SleepFor(absl::Milliseconds(150));
    answered +=
        PullRoutedBy(cluster[2], gave) == grpc::StatusCode::FAILED_PRECONDITION;
  }
  CHECK(answered == 8);
  CHECK(cluster[2].process->Running());
  absl::StatusOr<int> stopped = cluster[2].process->Wait(absl::Seconds(10));
  INFO(cluster[2].process->LogTail());
  REQUIRE_OK(stopped.status());
  CHECK(*stopped == 0);
  CHECK(absl::StrContains(cluster[2].process->ReadLog(), "drained: answered"));

  // A fresh process where shard 2 was: the run grows onto it and shard 3.
  StartShard(&cluster, 2);
  WaitForServing(cluster, {0, 1, 2, 3});
  for (const ServerProcess& p : cluster) {
    absl::StatusOr<StatusResponse> st = Status(p);
    REQUIRE_OK(st.status());
    CHECK_FALSE(st->drained());
  }
  // A shard that stops answering is not scaled away (it may hold slots).
  StopShard(&cluster, 3);  // its slots are unreachable until it is back
  absl::SleepFor(absl::Seconds(1));
  CHECK(Serving(cluster) == std::vector<int>{0, 1, 2, 3});

  REQUIRE_OK((*follower)->Signal(SIGTERM));
  absl::StatusOr<int> exit = (*follower)->Wait(absl::Seconds(10));
  INFO((*follower)->ReadLog());
  REQUIRE_OK(exit.status());
  CHECK(*exit == 0);
  CHECK(absl::StrContains((*follower)->ReadLog(), "scale to 4 shards"));
}

TEST_CASE("bad scales are refused and change nothing",
          "[slots][scale][bad-input]") {
  auto cluster = testing::StartPsCluster(2, {"--num_slots=16"});
  REQUIRE_OK(cluster.status());
  const std::string servers = "--servers=" + testing::ServerList(*cluster);
  for (const std::vector<std::string>& bad :
       std::vector<std::vector<std::string>>{{"--shards=0"},
                                             {"--shards=3"},
                                             {"--shards=-1"},
                                             {},
                                             {"--watch=1s", "--shards=1"}}) {
    std::vector<std::string> args = {"scale", servers};
    args.insert(args.end(), bad.begin(), bad.end());
    const auto [code, out] = Psctl(args);
    INFO(out);
    CHECK(code == 2);
    CHECK(absl::StrContains(out, "--shards"));
  }
  // --slot_list belongs to move.
  const auto [misplaced, mout] =
      Psctl({"scale", servers, "--shards=1", "--slot_list=3"});
  INFO(mout);
  CHECK(misplaced == 2);
  // A static run scales only on stopped files (psctl reshard).
  auto fixed = testing::StartPsCluster(2);
  REQUIRE_OK(fixed.status());
  const auto [sc, sout] = Psctl(
      {"scale", "--servers=" + testing::ServerList(*fixed), "--shards=1"});
  INFO(sout);
  CHECK(sc == 2);
  CHECK(absl::StrContains(sout, "slotted run"));
  std::vector<std::string> addresses;
  for (const ServerProcess& s : *cluster) addresses.push_back(s.address);
  std::unique_ptr<PsClient> c = ConnectClient(addresses);
  absl::StatusOr<std::vector<StatusResponse>> st = c->Status();
  REQUIRE_OK(st.status());
  for (const StatusResponse& s : *st) CHECK(s.map().epoch() == 1);
}

}  // namespace
}  // namespace asyncps
