// Live slot moves on real ps_server shards (separate processes on port 0)
// while a worker trains: psctl move and psctl rebalance --apply take slots
// from shard to shard, one map epoch each, and the worker goes on without
// an error. SGD with learning rate 1 and gradients of -1 make the values an
// exact ledger: every element of the dense tensor and of every row equals
// the number of pushes acknowledged, so an update lost or applied twice by
// a move shows. Bad moves are refused and change nothing.
#include <signal.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/ps_client.h"
#include "common/shard_map.h"
#include "common/shard_map_proto.h"
#include "proto/asyncps.pb.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

using testing::RunfilePath;
using testing::ServerList;
using testing::ServerProcess;
using testing::StartPsCluster;
using testing::Subprocess;

constexpr int kShards = 3;
constexpr int kSlots = 64;
constexpr int kDim = 4;
constexpr int kElems = 64 * 16;  // 64 slices of 16
constexpr int kRows = 300;

TensorSpec Dense() {
  TensorSpec w;
  w.set_name("w");
  w.add_shape(kElems);
  w.set_slice_elems(16);
  w.mutable_optimizer()->set_type(OPT_SGD);
  w.mutable_optimizer()->set_learning_rate(1.0f);
  return w;
}

TableSpec Table() {
  TableSpec t;
  t.set_name("emb");
  t.set_dim(kDim);
  t.mutable_optimizer()->set_type(OPT_SGD);
  t.mutable_optimizer()->set_learning_rate(1.0f);
  return t;
}

std::vector<uint64_t> Ids() {
  std::vector<uint64_t> ids;
  for (int i = 0; i < kRows; ++i) ids.push_back(uint64_t{7919} * i + 3);
  return ids;
}

std::unique_ptr<PsClient> Connect(const std::vector<ServerProcess>& cluster) {
  PsClientOptions o;
  for (const ServerProcess& s : cluster) o.servers.push_back(s.address);
  o.retry.call_deadline = absl::Seconds(60);
  std::unique_ptr<PsClient> c = PsClient::Connect(o).value();
  REQUIRE_OK(c->WaitForShards(absl::Seconds(30)));
  REQUIRE_OK(c->Register().status());
  return c;
}

// Runs tools/psctl with `args`: its exit status and output.
std::pair<int, std::string> Psctl(const std::vector<std::string>& args) {
  absl::StatusOr<testing::ToolRun> run =
      testing::RunTool("tools/psctl", args, absl::Seconds(120));
  REQUIRE_OK(run.status());
  return {run->exit_code, run->output};
}

// Trains until told to stop: every step pulls everything and pushes -1 for
// every element and row. Counts the pushes acknowledged; the first error
// ends it.
struct Trainer {
  PsClient* client = nullptr;
  std::vector<uint64_t> ids = Ids();
  std::atomic<int64_t> acked{0};
  std::atomic<bool> stop{false};
  absl::Status error;
  int64_t stale = 0;
  absl::Notification warmed;  // 10 steps done

  void Run() {
    std::vector<float> w(kElems), rows(ids.size() * kDim);
    const std::vector<float> gw(kElems, -1.0f), grows(rows.size(), -1.0f);
    for (int64_t step = 1; !stop.load() && step < 100000; ++step) {
      auto pull = client->StartPull(
          step, step, PullSet{{{"w", w.data()}}, {{"emb", ids, rows.data()}}});
      error = pull->Wait();
      if (!error.ok()) return;
      auto push = client->StartPush(
          step, PushSet{{{"w", gw.data()}}, {{"emb", ids, grows.data()}}},
          pull->read());
      absl::StatusOr<PushSummary> done = push->Wait();
      if (!done.ok()) {
        error = done.status();
        return;
      }
      stale += done->refused_stale + done->refused_restored;
      acked.fetch_add(1);
      if (step == 10) warmed.Notify();
    }
  }
};

TEST_CASE(
    "slots move between live shards while a worker trains: no error, every "
    "acknowledged push applied exactly once",
    "[slots][live-move][ledger]") {
  auto cluster =
      StartPsCluster(kShards, {absl::StrCat("--num_slots=", kSlots)});
  REQUIRE_OK(cluster.status());
  const std::string servers = "--servers=" + ServerList(*cluster);
  std::unique_ptr<PsClient> c = Connect(*cluster);
  REQUIRE_OK(c->CreateTables({Table()}));
  REQUIRE_OK(c->CreateTensors({Dense()}));

  Trainer t;
  t.client = c.get();
  std::thread training([&t] { t.Run(); });
  REQUIRE(t.warmed.WaitForNotificationWithTimeout(absl::Seconds(60)));

  // Slots 0-15 to shard 1 (from shards 0 and 2: two moves), then 0-7 to
  // shard 2, then an even-out by rows pushed.
  const auto [c1, out1] =
      Psctl({"move", servers, "--slot_list=0-15", "--to_shard=1"});
  INFO(out1);
  CHECK(c1 == 0);
  CHECK(absl::StrContains(out1, "shard 0 -> 1"));
  CHECK(absl::StrContains(out1, "shard 2 -> 1"));
  const int64_t after_first = t.acked.load();
  const auto [c2, out2] =
      Psctl({"move", servers, "--slot_list=0-7", "--to_shard=2", "-o", "json"});
  INFO(out2);
  CHECK(c2 == 0);
  CHECK(absl::StrContains(out2, "\"complete\":true"));
  const auto [c3, out3] = Psctl(
      {"rebalance", servers, "--apply", "--by=updates", "--threshold=1.0"});
  INFO(out3);
  CHECK(c3 == 0);
  // Training went on through the moves.
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (t.acked.load() < after_first + 20 && absl::Now() < until &&
         t.error.ok()) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  t.stop = true;
  training.join();
  REQUIRE_OK(t.error);
  CHECK(t.stale == 0);
  const int64_t n = t.acked.load();
  CHECK(n > after_first);

  // Every shard serves the last map; slots 0-7 on shard 2, 8-15 on 1.
  absl::StatusOr<std::vector<StatusResponse>> st = c->Status();
  REQUIRE_OK(st.status());
  const ShardMap last = *ShardMapOr((*st)[0].map(), kShards);
  CHECK(last.epoch() >= 4);
  for (const StatusResponse& s : *st) CHECK(s.map().epoch() == last.epoch());

  // The ledger, read by a client that starts now (it adopts the new map).
  c.reset();
  std::unique_ptr<PsClient> reader = Connect(*cluster);
  REQUIRE_OK(reader->WaitForTensors({"emb", "w"}, absl::Seconds(30)));
  CHECK(reader->map() == last);
  const std::vector<uint64_t> ids = Ids();
  std::vector<float> w(kElems), rows(kRows * kDim);
  auto pull = reader->StartPull(
      1, 1, PullSet{{{"w", w.data()}}, {{"emb", ids, rows.data(), true}}});
  REQUIRE_OK(pull->Wait());
  int wrong = 0;
  for (float v : w) wrong += v != static_cast<float>(n);
  for (float v : rows) wrong += v != static_cast<float>(n);
  INFO("acknowledged pushes " << n << "; w[0] " << w[0] << ", row 0 "
                              << rows[0]);
  CHECK(wrong == 0);
}

TEST_CASE(
    "the automatic rebalance moves hot slots off the busiest shard while a "
    "worker trains, every push applied exactly once",
    "[slots][live-move][rebalance][ledger]") {
  auto cluster =
      StartPsCluster(kShards, {absl::StrCat("--num_slots=", kSlots)});
  REQUIRE_OK(cluster.status());
  std::unique_ptr<PsClient> c = Connect(*cluster);
  REQUIRE_OK(c->CreateTables({Table()}));
  REQUIRE_OK(c->CreateTensors({Dense()}));
  // Every row the worker pushes is homed on shard 0: it carries all the
  // rows' load.
  const ShardMap even = c->map();
  const ShardMap::TableKey key = ShardMap::KeyOf("emb");
  Trainer t;
  t.client = c.get();
  t.ids.clear();
  for (uint64_t id = 1; t.ids.size() < 200; ++id) {
    if (even.RowHome(key, id) == 0) t.ids.push_back(id);
  }
  std::thread training([&t] { t.Run(); });
  REQUIRE(t.warmed.WaitForNotificationWithTimeout(absl::Seconds(60)));
  auto watch = Subprocess::Start(
      RunfilePath("tools/psctl"),
      {"rebalance", "--servers=" + ServerList(*cluster), "--apply",
       "--watch=1s", "--by=rows", "--threshold=1.1"});
  REQUIRE_OK(watch.status());
  // Until shard 0 gave slots away (or 30 s).
  absl::Status moved = testing::WaitFor(
      [&] {
        absl::StatusOr<std::vector<StatusResponse>> st = c->Status();
        return st.ok() && (*st)[0].map().epoch() > 1;
      },
      absl::Seconds(30), "an automatic move", absl::Milliseconds(100));
  absl::SleepFor(absl::Seconds(1));
  REQUIRE_OK((*watch)->Signal(SIGINT));
  absl::StatusOr<int> code = (*watch)->Wait(absl::Seconds(60));
  t.stop = true;
  training.join();
  INFO((*watch)->ReadLog());
  REQUIRE_OK(moved);
  REQUIRE_OK(code.status());
  CHECK(*code == 0);
  REQUIRE_OK(t.error);
  CHECK(t.stale == 0);
  CHECK(absl::StrContains((*watch)->ReadLog(), "shard 0 -> "));

  // Shard 0 owns fewer slots; the ledger holds.
  const ShardMap now = c->map();
  int owned = 0;
  for (const uint16_t o : now.owners()) owned += o == 0;
  CHECK(owned < kSlots / kShards + 1);
  c.reset();
  std::unique_ptr<PsClient> reader = Connect(*cluster);
  REQUIRE_OK(reader->WaitForTensors({"emb", "w"}, absl::Seconds(30)));
  std::vector<float> w(kElems), rows(t.ids.size() * kDim);
  auto pull = reader->StartPull(
      1, 1, PullSet{{{"w", w.data()}}, {{"emb", t.ids, rows.data(), true}}});
  REQUIRE_OK(pull->Wait());
  const float n = static_cast<float>(t.acked.load());
  int wrong = 0;
  for (float v : w) wrong += v != n;
  for (float v : rows) wrong += v != n;
  CHECK(wrong == 0);
}

TEST_CASE("bad moves are refused and change nothing",
          "[slots][live-move][bad-input]") {
  auto cluster = StartPsCluster(2, {"--num_slots=16"});
  REQUIRE_OK(cluster.status());
  const std::string servers = "--servers=" + ServerList(*cluster);
  for (const std::vector<std::string>& bad :
       std::vector<std::vector<std::string>>{
           {"--slot_list=16", "--to_shard=0"},
           {"--slot_list=3", "--to_shard=2"},
           {"--slot_list=x", "--to_shard=0"},
           {"--slot_list=5-2", "--to_shard=0"},
           {"--to_shard=0"}}) {
    std::vector<std::string> args = {"move", servers};
    args.insert(args.end(), bad.begin(), bad.end());
    const auto [code, out] = Psctl(args);
    INFO(out);
    CHECK(code == 2);
  }
  // A slot already on its shard moves nothing.
  const auto [code, out] =
      Psctl({"move", servers, "--slot_list=0", "--to_shard=0"});
  INFO(out);
  CHECK(code == 0);
  CHECK(absl::StrContains(out, "nothing to move"));
  // A static run has no slots to move.
  auto fixed = StartPsCluster(2);
  REQUIRE_OK(fixed.status());
  const auto [sc, sout] = Psctl({"move", "--servers=" + ServerList(*fixed),
                                 "--slot_list=0", "--to_shard=1"});
  INFO(sout);
  CHECK(sc == 2);
  CHECK(absl::StrContains(sout, "--num_slots"));
  std::unique_ptr<PsClient> c = Connect(*cluster);
  absl::StatusOr<std::vector<StatusResponse>> st = c->Status();
  REQUIRE_OK(st.status());
  for (const StatusResponse& s : *st) CHECK(s.map().epoch() == 1);
}

}  // namespace
}  // namespace asyncps
