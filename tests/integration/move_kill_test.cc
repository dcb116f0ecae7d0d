// A live slot move whose source or destination is killed (SIGKILL) while
// the move runs ends committed on both shards or aborted on both, and
// nothing held before it is lost: real ps_server processes with
// checkpoints, 192 MiB of Adam state on each, half of shard 0's slots
// moving to shard 1; the victim is killed at points of the move (as the
// destination starts, while it copies, once the source is fenced, once the
// move committed), restarted on its files and port, and `psctl adopt`
// brings both to the newest map.
// Then both shards serve one map and every value and row reads back
// exactly as before the move.
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
#include "proto/asyncps.pb.h"
#include "proto/slot_moves.grpc.pb.h"
#include "tests/integration/ledger_trainer.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/table_helpers.h"

namespace asyncps {
namespace {

using testing::RunfilePath;
using testing::ServerProcess;
using testing::Subprocess;

constexpr int kSlots = 64;
constexpr int64_t kElems = int64_t{32} << 20;  // 128 MiB of values
constexpr int kRows = 4000;
constexpr int kDim = 8;

TensorSpec Dense() {
  TensorSpec w;
  w.set_name("w");
  w.add_shape(kElems);
  w.set_slice_elems(1 << 16);
  w.set_init(INIT_NORMAL);
  w.set_init_value(0.1f);
  w.set_seed(11);
  *w.mutable_optimizer() = testing::AdamSpec();
  return w;
}

std::vector<uint64_t> Ids() {
  std::vector<uint64_t> ids;
  for (int i = 0; i < kRows; ++i) ids.push_back(uint64_t{104729} * i + 1);
  return ids;
}

// Every value of w and every row, as the shards hold them now.
std::vector<float> Snapshot(PsClient* c) {
  std::vector<float> out(kElems + kRows * kDim);
  const std::vector<uint64_t> ids = Ids();
  auto pull = c->StartPull(
      1, 1,
      PullSet{{{"w", out.data()}}, {{"emb", ids, out.data() + kElems, true}}});
  REQUIRE_OK(pull->Wait());
  return out;
}

// Runs tools/psctl with `args`: its exit status and output.
std::pair<int, std::string> Psctl(const std::vector<std::string>& args) {
  absl::StatusOr<testing::ToolRun> run =
      testing::RunTool("tools/psctl", args, absl::Seconds(120));
  REQUIRE_OK(run.status());
  return {run->exit_code, run->output};
}

// Where in a move the victim dies: `delay` after `who` (0 source, 1
// destination) logs `text`.
struct KillPoint {
  int who;
  const char* text;
  absl::Duration delay;
};
// The destination starts, the source fences, the move committed.
constexpr char kStarts[] = " I moving ";
constexpr char kFenced[] = "fenced for the move";
constexpr char kCommitted[] = " I moved ";

void KillDuringMove(bool kill_destination, KillPoint at) {
  const std::string dir = testing::MakeTmpDir("move-kill");
  const std::vector<std::string> args = {absl::StrCat("--num_slots=", kSlots),
                                         "--checkpoint_dir=" + dir};
  std::vector<ServerProcess> shards;
  std::vector<std::string> servers;
  for (int i = 0; i < 2; ++i) {
    auto s = testing::StartPsServer(i, 2, args);
    REQUIRE_OK(s.status());
    servers.push_back(s->address);
    shards.push_back(*std::move(s));
  }
  const std::string list = "--servers=" + servers[0] + "," + servers[1];
  std::vector<float> before;
  {
    std::unique_ptr<PsClient> c = testing::ConnectClient(servers);
    REQUIRE_OK(c->CreateTables({testing::AdagradTable(kDim)}));
    REQUIRE_OK(c->CreateTensors({Dense()}));
    // One step, so that versions and optimizer state are not the start's.
    const std::vector<uint64_t> ids = Ids();
    std::vector<float> w(kElems), rows(kRows * kDim);
    auto pull = c->StartPull(
        1, 1, PullSet{{{"w", w.data()}}, {{"emb", ids, rows.data()}}});
    REQUIRE_OK(pull->Wait());
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.001f * (i % 17) - 0.008f;
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = 0.01f * (i % 5);
    auto push =
        c->StartPush(1, PushSet{{{"w", w.data()}}, {{"emb", ids, rows.data()}}},
                     pull->read());
    REQUIRE_OK(push->Wait().status());
    before = Snapshot(c.get());
  }
  const auto [ck, ck_out] = Psctl({"checkpoint", list});
  INFO(ck_out);
  REQUIRE(ck == 0);

  // Half of shard 0's slots to shard 1.
  std::string slots;
  const ShardMap even = *ShardMap::EvenSlots(2, kSlots);
  for (int s = 0, n = 0; s < kSlots; ++s) {
    if (even.owners()[s] == 0 && n++ % 2 == 0) {
      absl::StrAppend(&slots, slots.empty() ? "" : ",", s);
    }
  }
  auto move =
      Subprocess::Start(RunfilePath("tools/psctl"),
                        {"move", list, "--slot_list=" + slots, "--to_shard=1"});
  REQUIRE_OK(move.status());
  Subprocess* watched = shards[at.who].process.get();
  REQUIRE_OK(testing::WaitFor(
      [&] { return absl::StrContains(watched->ReadLog(), at.text); },
      absl::Seconds(60), at.text, absl::Milliseconds(1)));
  absl::SleepFor(at.delay);
  const int victim = kill_destination ? 1 : 0;
  REQUIRE_OK(shards[victim].process->Signal(SIGKILL));
  REQUIRE_OK(shards[victim].process->Wait(absl::Seconds(20)).status());
  absl::StatusOr<int> moved = (*move)->Wait(absl::Seconds(120));
  REQUIRE_OK(moved.status());
  INFO("psctl move: " << (*move)->ReadLog());
  CHECK((*moved == 0 || *moved == 1));

  if (kill_destination && at.text == kFenced) {
    // A FinishMove from anyone but the destination ends nothing: the
    // source asks the destination, which is down, and stays fenced.
    auto stub = SlotMoves::NewStub(MakeChannel(servers[0]));
    for (const bool committed : {true, false}) {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
      FinishMoveRequest word;
      word.set_move_epoch(2);
      word.set_committed(committed);
      FinishMoveResponse unused;
      CHECK(stub->FinishMove(&ctx, word, &unused).error_code() ==
            grpc::StatusCode::UNAVAILABLE);
    }
    // The source stays fenced until the destination says how the move
    // ended; psctl status shows it.
    const auto [sc, status] = Psctl({"status", "--servers=" + servers[0]});
    INFO(status);
    CHECK(absl::StrContains(status, "shard 0: fenced for "));
  }
  const int port =
      std::stoi(servers[victim].substr(servers[victim].rfind(':') + 1));
  auto again = testing::StartPsServer(victim, 2, args, absl::Seconds(60), port);
  REQUIRE_OK(again.status());
  shards[victim] = *std::move(again);
  // The source may stay fenced until the destination says how the move
  // ended (it asks every 2 s): adopt is refused meanwhile.
  int adopted = -1;
  std::string adopt_out;
  REQUIRE_OK(testing::WaitFor(
      [&] {
        std::tie(adopted, adopt_out) = Psctl({"adopt", list});
        return adopted == 0;
      },
      absl::Seconds(60), "both shards to serve the newest map",
      absl::Milliseconds(500)));

  std::unique_ptr<PsClient> c = testing::ConnectClient(servers);
  REQUIRE_OK(c->WaitForTensors({"emb", "w"}, absl::Seconds(30)));
  absl::StatusOr<std::vector<StatusResponse>> st = c->Status();
  REQUIRE_OK(st.status());
  const ShardMap a = *ShardMapOr((*st)[0].map(), 2);
  const ShardMap b = *ShardMapOr((*st)[1].map(), 2);
  CHECK(a == b);
  CHECK((a.epoch() == 1 || a.epoch() == 2));
  // psctl's word matches how the move ended: exit 0 only for a move that
  // committed; a failure says why (the destination, which decides, is
  // down, or it aborted the move).
  const std::string said = (*move)->ReadLog();
  if (a.epoch() == 1) CHECK(*moved == 1);
  if (*moved == 1) {
    const bool down = absl::StrContains(said, "does not answer");
    const bool aborted = absl::StrContains(said, "the move was aborted");
    CHECK((down || aborted));
    if (aborted) CHECK(a.epoch() == 1);
  }
  WARN((kill_destination ? "destination" : "source")
       << " killed " << absl::FormatDuration(at.delay) << " after shard "
       << at.who << " logged '" << at.text << "': psctl move exit " << *moved
       << ", the move " << (a.epoch() == 2 ? "committed" : "aborted"));
  const std::vector<float> after = Snapshot(c.get());
  REQUIRE(after.size() == before.size());
  int64_t wrong = 0;
  for (size_t i = 0; i < after.size(); ++i) wrong += after[i] != before[i];
  CHECK(wrong == 0);
}

TEST_CASE("a move whose destination is killed ends on one map, nothing lost",
          "[slots][live-move][kill]") {
  SECTION("as it starts") { KillDuringMove(true, {1, kStarts, {}}); }
  SECTION("while it copies") {
    KillDuringMove(true, {1, kStarts, absl::Milliseconds(300)});
  }
  SECTION("once the source is fenced") {
    KillDuringMove(true, {0, kFenced, {}});
  }
  SECTION("once committed") { KillDuringMove(true, {1, kCommitted, {}}); }
}

TEST_CASE("a move whose source is killed ends on one map, nothing lost",
          "[slots][live-move][kill]") {
  SECTION("as it starts") { KillDuringMove(false, {1, kStarts, {}}); }
  SECTION("while it copies") {
    KillDuringMove(false, {1, kStarts, absl::Milliseconds(300)});
  }
  SECTION("once fenced") { KillDuringMove(false, {0, kFenced, {}}); }
  SECTION("once committed") { KillDuringMove(false, {1, kCommitted, {}}); }
}

}  // namespace
}  // namespace asyncps
