// A slotted run on real ps_server shards (separate processes on port 0):
// clients adopt the map the shards serve and route every key by it; psctl
// rebalance reads the shards' per-slot load and plans a map that evens a
// skewed load out; psctl reshard --map moves the stopped run's files onto
// it, and the shards restarted on them serve every row and slice exactly
// as before under the new map. Shards that serve different maps are
// refused by the client; bad --num_slots exits 2.
#include <catch2/catch.hpp>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/ps_client.h"
#include "common/shard_map.h"
#include "common/shard_map_proto.h"
#include "proto/asyncps.pb.h"
#include "tests/integration/ledger_trainer.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

using testing::RunfilePath;
using testing::ServerProcess;
using testing::StartPsCluster;
using testing::Subprocess;

constexpr int kDim = 8;
constexpr int kShards = 3;

TensorSpec Dense() {
  TensorSpec w;
  w.set_name("w");
  w.add_shape(40);
  w.add_shape(25);
  w.set_slice_elems(64);
  w.set_init(INIT_NORMAL);
  w.set_init_value(0.3f);
  w.set_seed(3);
  w.mutable_optimizer()->set_type(OPT_SGD);
  w.mutable_optimizer()->set_learning_rate(0.01f);
  return w;
}

// Runs tools/psctl with `args`: its exit status and output.
std::pair<int, std::string> Psctl(const std::vector<std::string>& args) {
  absl::StatusOr<testing::ToolRun> run =
      testing::RunTool("tools/psctl", args, absl::Seconds(60));
  REQUIRE_OK(run.status());
  return {run->exit_code, run->output};
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

double JsonNumber(const std::string& json, const std::string& key) {
  std::smatch m;
  REQUIRE(
      std::regex_search(json, m, std::regex("\"" + key + "\":([0-9.eE+-]+)")));
  return std::stod(m[1]);
}

// Every row of `ids` and the dense tensor, as the shards hold them now.
std::vector<float> Snapshot(PsClient* c, const std::vector<uint64_t>& ids,
                            int64_t clock) {
  std::vector<float> out(ids.size() * kDim + 1000);
  auto pull = c->StartPull(clock, clock,
                           PullSet{{{"w", out.data() + ids.size() * kDim}},
                                   {{"emb", ids, out.data(), /*peek=*/true}}});
  REQUIRE_OK(pull->Wait());
  return out;
}

TEST_CASE(
    "a slotted run is rebalanced from its per-slot load and restarts on the "
    "new map with every value as it was",
    "[slots][rebalance][reshard]") {
  const std::string dir = testing::MakeTmpDir("slotted");
  auto cluster = StartPsCluster(
      kShards, {"--num_slots=256", absl::StrCat("--checkpoint_dir=", dir)});
  REQUIRE_OK(cluster.status());
  std::unique_ptr<PsClient> c = testing::ConnectClient(*cluster);
  REQUIRE_OK(c->CreateTables({testing::AdagradTable(kDim)}));
  REQUIRE_OK(c->CreateTensors({Dense()}));
  const ShardMap even = c->map();
  REQUIRE(even == *ShardMap::EvenSlots(kShards, 256));

  // Skewed traffic: 60 hot ids, all homed on shard 0, in every step; 90
  // cold ones spread evenly.
  std::vector<uint64_t> hot, all;
  const ShardMap::TableKey key = ShardMap::KeyOf("emb");
  for (uint64_t id = 1; hot.size() < 60; ++id) {
    if (even.RowHome(key, id * 1000003) == 0) hot.push_back(id * 1000003);
  }
  all = hot;
  for (uint64_t id = 1; id <= 90; ++id) all.push_back((id << 40) + 17);
  const int steps = 12;
  for (int step = 1; step <= steps; ++step) {
    std::vector<uint64_t> ids = hot;
    for (int i = 0; i < 30; ++i) ids.push_back(all[60 + (step * 7 + i) % 90]);
    std::vector<float> rows(ids.size() * kDim), w(1000);
    auto pull = c->StartPull(
        step, step, PullSet{{{"w", w.data()}}, {{"emb", ids, rows.data()}}});
    REQUIRE_OK(pull->Wait());
    std::vector<float> grads(ids.size() * kDim), gw(1000);
    for (size_t i = 0; i < grads.size(); ++i)
      grads[i] = 0.01f * (i % 13) - 0.05f;
    for (size_t i = 0; i < gw.size(); ++i) gw[i] = 0.002f * (i % 7) - 0.006f;
    auto push = c->StartPush(
        step, PushSet{{{"w", gw.data()}}, {{"emb", ids, grads.data()}}},
        pull->read());
    absl::StatusOr<PushSummary> done = push->Wait();
    REQUIRE_OK(done.status());
  }

  // Rebalance by rows pushed: shard 0 carries (60 + ~10) x 12 of ~120 x 12.
  const std::string map_file = testing::UniqueTmpPath("map") + ".txt";
  const auto [code, out] = Psctl(
      {"rebalance", "--servers=" + ServerList(*cluster), "--out=" + map_file,
       "--by=rows", "--threshold=1.1", "-o", "json"});
  INFO(out);
  REQUIRE(code == 0);
  const double before = JsonNumber(out, "imbalance_before");
  const double after = JsonNumber(out, "imbalance_after");
  CHECK(before > 1.5);
  CHECK(after <= 1.1);
  CHECK(JsonNumber(out, "moved_slots") > 0);
  absl::StatusOr<ShardMap> planned = ShardMapFromText(ReadFile(map_file));
  REQUIRE_OK(planned.status());
  CHECK(planned->epoch() == 2);
  CHECK(*planned != even);

  const std::vector<float> held = Snapshot(c.get(), all, steps + 1);
  c.reset();
  for (ServerProcess& s : *cluster) {
    REQUIRE_OK(
        s.process->Kill(absl::Seconds(20)).status());  // final checkpoint
  }
  const std::string moved = testing::MakeTmpDir("moved");
  const auto [rc, reshard_out] =
      Psctl({"reshard", "--from=" + dir, "--to=" + moved,
             absl::StrCat("--shards=", kShards), "--map=" + map_file});
  INFO(reshard_out);
  REQUIRE(rc == 0);

  // Another slot count than the files' is refused, naming the right one.
  auto wrong = testing::StartPsServer(
      0, kShards, {"--num_slots=512", "--checkpoint_dir=" + moved},
      absl::Seconds(10));
  REQUIRE_FALSE(wrong.ok());
  CHECK(absl::StrContains(wrong.status().message(), "--num_slots=256"));

  auto restarted =
      StartPsCluster(kShards, {absl::StrCat("--checkpoint_dir=", moved)});
  REQUIRE_OK(restarted.status());
  std::unique_ptr<PsClient> again = testing::ConnectClient(*restarted);
  REQUIRE_OK(again->WaitForTensors({"emb", "w"}, absl::Seconds(30)));
  CHECK(again->map() == *planned);
  CHECK(Snapshot(again.get(), all, 1) == held);
  absl::StatusOr<std::vector<StatusResponse>> st = again->Status();
  REQUIRE_OK(st.status());
  for (const StatusResponse& s : *st) CHECK(s.map().epoch() == 2);
}

TEST_CASE("shards serving different maps, or bad --num_slots, are refused",
          "[slots][bad-input]") {
  auto a = testing::StartPsServer(0, 2, {"--num_slots=64"});
  auto b = testing::StartPsServer(1, 2, {"--num_slots=128"});
  REQUIRE_OK(a.status());
  REQUIRE_OK(b.status());
  std::vector<ServerProcess> mixed;
  mixed.push_back(*std::move(a));
  mixed.push_back(*std::move(b));
  // Refused as soon as the client has heard from both.
  PsClientOptions o;
  for (const ServerProcess& p : mixed) o.servers.push_back(p.address);
  std::unique_ptr<PsClient> c = PsClient::Connect(o).value();
  const absl::Status s = c->WaitForShards(absl::Seconds(30));
  INFO(s.ToString());
  CHECK(absl::IsFailedPrecondition(s));
  CHECK(absl::StrContains(s.message(), "--num_slots"));

  for (const char* bad :
       {"--num_slots=1", "--num_slots=-4", "--num_slots=2000000"}) {
    auto p = Subprocess::Start(RunfilePath("server/ps_server"),
                               {"--num_shards=2", "--port=0", bad});
    REQUIRE_OK(p.status());
    absl::StatusOr<int> code = (*p)->Wait(absl::Seconds(20));
    REQUIRE_OK(code.status());
    INFO(bad << ": " << (*p)->ReadLog());
    CHECK(*code == 2);
    CHECK(absl::StrContains((*p)->ReadLog(), "--num_slots must be"));
  }
}

}  // namespace
}  // namespace asyncps
