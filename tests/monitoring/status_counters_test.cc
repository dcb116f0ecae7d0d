// The Status RPC of a real ps_server process counts exactly what happened:
// a scripted sequence of pulls, pushes (one a retry, one too stale, one
// malformed) from two workers, then every counter, clock and histogram
// bucket is checked against the script.

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <string>
#include <utility>

#include "proto/asyncps.pb.h"
#include "tests/monitoring/shard_rpc.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

using testing::ServerProcess;
using testing::ShardRpc;
using testing::StartPsServer;

#define REQUIRE_RPC_OK(expr)                             \
  do {                                                   \
    const grpc::Status _s = (expr);                      \
    INFO(_s.error_code() << ": " << _s.error_message()); \
    REQUIRE(_s.ok());                                    \
  } while (0)

constexpr int32_t kA = 1;
constexpr uint64_t kIncA = 11;
constexpr int32_t kB = 2;
constexpr uint64_t kIncB = 22;

const WorkerStatus* FindWorker(const StatusResponse& s, int32_t id) {
  for (const WorkerStatus& w : s.workers()) {
    if (w.worker_id() == id) return &w;
  }
  return nullptr;
}

TEST_CASE("status counters match a scripted sequence exactly",
          "[monitoring][status]") {
  // One shard holds both slices of an 8-element tensor (4 per slice); any
  // gradient read one update ago is refused.
  absl::StatusOr<ServerProcess> server =
      StartPsServer(0, 1, {"--max_staleness=0", "--log_level=warn"});
  REQUIRE(server.ok());
  INFO("server log:\n" << server->process->LogTail());
  ShardRpc rpc(server->address);
  REQUIRE_RPC_OK(rpc.Create(testing::ZerosSpec("w", 8, 4)));
  constexpr uint64_t kSliceBytes = 4 * sizeof(float);

  PullResponse pull;
  PushResponse push;
  // Pulls 1 and 2: both workers read version 0 of both slices.
  REQUIRE_RPC_OK(rpc.Pull(kA, kIncA, 0, "w", &pull));
  REQUIRE(pull.slices_size() == 2);
  REQUIRE_RPC_OK(rpc.Pull(kB, kIncB, 0, "w", &pull));

  // Push 1 (A, seq 1): both slices applied at staleness 0 -> versions 1.
  REQUIRE_RPC_OK(rpc.Push(kA, kIncA, 0, 1, {{0, 0}, {1, 0}}, "w", 4, &push));
  REQUIRE_FALSE(push.duplicate());
  REQUIRE(push.results_size() == 2);
  CHECK(push.results(0).outcome() == APPLIED);
  CHECK(push.results(1).outcome() == APPLIED);

  // Push 2: A retries seq 1; acknowledged as a duplicate, nothing applied.
  push.Clear();
  REQUIRE_RPC_OK(rpc.Push(kA, kIncA, 0, 1, {{0, 0}, {1, 0}}, "w", 4, &push));
  REQUIRE(push.duplicate());
  CHECK(push.results_size() == 0);

  // Push 3 (B, seq 1): slice 0 read at version 0, now 1: staleness 1 > 0.
  push.Clear();
  REQUIRE_RPC_OK(rpc.Push(kB, kIncB, 0, 1, {{0, 0}}, "w", 4, &push));
  REQUIRE(push.results_size() == 1);
  CHECK(push.results(0).outcome() == REFUSED_STALE);
  CHECK(push.results(0).staleness() == 1);

  // Pulls 3 and 4 at clock 1, then push 4 (A, seq 2) fresh: staleness 0.
  REQUIRE_RPC_OK(rpc.Pull(kA, kIncA, 1, "w", &pull));
  REQUIRE_RPC_OK(rpc.Pull(kB, kIncB, 1, "w", &pull));
  push.Clear();
  REQUIRE_RPC_OK(rpc.Push(kA, kIncA, 1, 2, {{0, 1}, {1, 1}}, "w", 4, &push));
  CHECK(push.results(0).outcome() == APPLIED);
  CHECK(push.results(1).outcome() == APPLIED);

  // A malformed push (3 floats for a 4-element slice) is rejected whole.
  push.Clear();
  const grpc::Status bad = rpc.Push(kB, kIncB, 1, 2, {{1, 2}}, "w", 3, &push);
  CHECK(bad.error_code() == grpc::StatusCode::INVALID_ARGUMENT);

  StatusResponse st;
  REQUIRE_RPC_OK(rpc.Status(&st));
  INFO(st.DebugString());
  CHECK(st.shard_index() == 0);
  CHECK(st.num_shards() == 1);
  // The address actually bound (the shard listens on all interfaces).
  CHECK(st.address() ==
        "0.0.0.0" + server->address.substr(server->address.rfind(':')));
  CHECK(st.tensors() == 1);
  CHECK(st.slices() == 2);
  CHECK(st.parameter_bytes() == 2 * kSliceBytes);
  CHECK(st.policy().consistency() == ASP);
  CHECK(st.policy().max_staleness() == 0);

  const Counters& c = st.counters();
  CHECK(c.pulls() == 4);
  CHECK(c.bytes_out() == 4 * 2 * kSliceBytes);
  CHECK(c.pushes() == 4);
  CHECK(c.duplicate_pushes() == 1);
  CHECK(c.updates_applied() == 4);
  CHECK(c.refused_stale() == 1);
  CHECK(c.scaled() == 0);
  CHECK(c.rejected_bad_input() == 1);
  // Every accepted push's payload counts, the retry's too; the malformed one
  // does not.
  CHECK(c.bytes_in() == (2 + 2 + 1 + 2) * kSliceBytes);
  CHECK(c.evictions() == 0);
  CHECK(c.pull_waits() == 0);
  CHECK(c.pull_wait_timeouts() == 0);

  // Staleness: four updates at 0, one at 1.
  const StalenessHistogram& h = st.staleness();
  REQUIRE(h.counts_size() == h.upper_bounds_size());
  REQUIRE(h.counts_size() > 2);
  CHECK(h.upper_bounds(0) == 1);
  CHECK(h.counts(0) == 4);
  CHECK(h.upper_bounds(1) == 2);
  CHECK(h.counts(1) == 1);
  uint64_t rest = 0;
  for (int i = 2; i < h.counts_size(); ++i) rest += h.counts(i);
  CHECK(rest == 0);
  CHECK(h.max() == 1);
  CHECK(h.sum() == 1);
  CHECK(h.mean() == Approx(0.2));
  CHECK(h.p50() == 0);

  // A completed two steps (pushes at clocks 0 and 1), B one (its refused
  // push still completes its step; the malformed one does not count).
  const WorkerStatus* a = FindWorker(st, kA);
  const WorkerStatus* b = FindWorker(st, kB);
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  CHECK(st.workers_size() == 2);
  CHECK(a->incarnation() == kIncA);
  CHECK(a->clock() == 2);
  CHECK(a->lag() == 0);
  CHECK(a->pushes() == 2);
  CHECK(a->live());
  CHECK_FALSE(a->left());
  CHECK(b->incarnation() == kIncB);
  CHECK(b->clock() == 1);
  CHECK(b->lag() == 1);
  CHECK(b->pushes() == 1);
  CHECK(b->live());
  CHECK(st.min_clock() == 1);
  CHECK(st.max_clock() == 2);
  CHECK(a->last_heartbeat_age_ms() >= 0);
  CHECK(a->last_heartbeat_age_ms() < 60000);
}

}  // namespace
}  // namespace asyncps
