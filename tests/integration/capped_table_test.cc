// A table that never fills up, on real ps_server shards (separate
// processes on port 0): two capped shards fed far more distinct ids than
// they hold, through PsClient, evict their coldest rows instead of
// refusing new ones, and never evict a hot set touched every step.
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "client/ps_client.h"
#include "common/row_initializer.h"
#include "proto/asyncps.pb.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

using testing::ServerProcess;
using testing::StartPsCluster;

constexpr int kDim = 8;

TableSpec LruTable() {
  TableSpec t;
  t.set_name("emb");
  t.set_dim(kDim);
  t.set_init(INIT_UNIFORM);
  t.set_init_value(0.1f);
  t.set_seed(11);
  t.mutable_optimizer()->set_type(OPT_SGD);
  t.mutable_optimizer()->set_learning_rate(0.125f);
  t.set_eviction(EVICT_LRU);
  return t;
}

TEST_CASE(
    "a capped shard fed more distinct ids than fit evicts cold rows, refuses "
    "no push and keeps the hot set",
    "[rows][memory][eviction]") {
  // Room for about 2900 rows of dim 8 (SGD: 32 + 64 bytes each) per shard;
  // the run touches 200 hot ids and 24000 fresh ones.
  auto cluster = StartPsCluster(2, {"--max_parameter_bytes=300K"});
  REQUIRE_OK(cluster.status());
  std::vector<std::string> servers;
  for (const ServerProcess& s : *cluster) servers.push_back(s.address);
  PsClientOptions o;
  o.servers = servers;
  o.retry.call_deadline = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<PsClient>> client = PsClient::Connect(o);
  REQUIRE_OK(client.status());
  PsClient& c = **client;
  REQUIRE_OK(c.WaitForShards(absl::Seconds(30)));
  REQUIRE_OK(c.Register().status());
  const TableSpec spec = LruTable();
  REQUIRE_OK(c.CreateTables({spec}));

  std::vector<uint64_t> hot;
  for (uint64_t i = 1; i <= 200; ++i) hot.push_back(i * 7919);
  const int steps = 40;
  uint64_t fresh = 1u << 30;
  for (int step = 1; step <= steps; ++step) {
    std::vector<uint64_t> ids = hot;
    for (int i = 0; i < 600; ++i) ids.push_back(fresh++);
    std::vector<float> values(ids.size() * kDim);
    auto pull = c.StartPullRows(step, step, {{"emb", ids, values.data()}});
    REQUIRE_OK(pull->Wait());
    const std::vector<float> grads(ids.size() * kDim, 1.0f);
    auto push =
        c.StartPushRows(step, {{"emb", ids, grads.data()}}, pull->read());
    absl::StatusOr<PushSummary> summary = push->Wait();
    REQUIRE_OK(summary.status());
    REQUIRE(summary->applied == static_cast<int64_t>(ids.size()));
    REQUIRE(summary->refused_restored == 0);
    REQUIRE(summary->refused_stale == 0);
  }

  // The hot rows took every step's update: never evicted (an evicted row
  // would have come back at its initial values).
  std::vector<float> values(hot.size() * kDim);
  REQUIRE_OK(
      c.StartPullRows(steps + 1, steps + 1, {{"emb", hot, values.data()}})
          ->Wait());
  for (size_t i = 0; i < hot.size(); ++i) {
    std::vector<float> initial(kDim);
    RowInitializer(spec).Fill(hot[i], initial.data());
    for (int d = 0; d < kDim; ++d) {
      REQUIRE(values[i * kDim + d] == Approx(initial[d] - 0.125f * steps));
    }
  }
  absl::StatusOr<std::vector<StatusResponse>> st = c.Status();
  REQUIRE_OK(st.status());
  uint64_t rows = 0, evicted = 0;
  for (const StatusResponse& s : *st) {
    INFO("shard " << s.shard_index());
    REQUIRE(s.reserved_parameter_bytes() <= s.max_parameter_bytes());
    const TableStatus& t = s.tables(0);
    REQUIRE(t.rows_evicted_cap() > 0);
    REQUIRE(t.rows_evicted_idle() == 0);
    REQUIRE(t.eviction() == EVICT_LRU);
    REQUIRE(t.fill_ratio() > 0.5);
    rows += t.rows();
    evicted += t.rows_evicted_cap();
  }
  REQUIRE(rows + evicted == hot.size() + 600u * steps);
}

}  // namespace
}  // namespace asyncps
