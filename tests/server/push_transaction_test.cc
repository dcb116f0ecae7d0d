// PushTransaction: the push's safety rules held by the type. A failure
// before Commit applies nothing (slices, rows, memory, seq all as before);
// a dropped prepared push gives everything back; a duplicate applies
// nothing; a push read before a restart is refused whole and settled; the
// checkpoint gate stays closed to checkpoints while a push is open.

#include "server/push_transaction.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/payload.h"
#include "server/push_gate.h"
#include "server/service_context.h"
#include "server/shard_stats.h"
#include "server/worker_registry.h"
#include "store/shard_store.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/table_helpers.h"
#include "tests/testing/tensor_specs.h"

namespace asyncps {
namespace {

constexpr uint64_t kEpoch = 77;

OptimizerSpec Sgd() {
  OptimizerSpec o;
  o.set_type(OPT_SGD);
  o.set_learning_rate(1.0f);
  return o;
}

// One shard: tensor "w" (4 x 1.0, one slice), table "emb" (dim 2, rows
// initialised to 0), a registry, the gate and the stats.
struct Shard {
  Shard() {
    ShardStoreOptions so;
    so.max_parameter_bytes = 1 << 20;
    store = ShardStore::Create(so).value();
    CreateTensorRequest req;
    *req.add_tensors() = testing::ConstantSpec("w", {4}, 1.0f, Sgd(), 4);
    *req.add_tables() =
        testing::MakeTableSpec("emb", 2, Sgd(), INIT_CONSTANT, 0.0f);
    REQUIRE_OK(store->CreateTensors(req).status());
    RegistryOptions ro;
    ro.background_thread = false;
    ro.logger = NullLogger();
    workers = WorkerRegistry::Create(ro).value();
    context.store = store.get();
    context.workers = workers.get();
    context.stats = &stats;
    context.gate = &gate;
    context.epoch = kEpoch;
    context.logger = NullLogger();
  }

  uint64_t BadInput() {
    Counters c;
    StalenessHistogram h;
    Rates r;
    stats.Snapshot(&c, &h, &r);
    return c.rejected_bad_input();
  }

  std::vector<float> W() {
    PullRequest req;
    req.add_tensors("w");
    PullResponse resp;
    REQUIRE_OK(store->Pull(req, &resp));
    std::vector<float> out(4);
    DecodeFloats(resp.slices(0).values(), out.data(), out.size());
    return out;
  }

  std::unique_ptr<ShardStore> store;
  std::unique_ptr<WorkerRegistry> workers;
  ShardStats stats;
  PushGate gate;
  ServiceContext context;
};

// A push of worker 0 (incarnation 1) with seq `seq`: gradient 0.5 on every
// element of "w", and `row_grad` on rows 1 and 2 of "emb".
PushRequest MakePush(uint64_t seq, float row_grad = 1.0f) {
  PushRequest req;
  req.mutable_worker()->set_worker_id(0);
  req.mutable_worker()->set_incarnation(1);
  req.set_seq(seq);
  req.set_read_epoch(kEpoch);
  SliceGradient* g = req.add_grads();
  g->set_tensor("w");
  g->set_slice(0);
  const std::vector<float> half(4, 0.5f);
  EncodeFloats(half.data(), half.size(), g->mutable_grad());
  RowsGradient* r = req.add_rows();
  r->set_table("emb");
  r->add_ids(1);
  r->add_ids(2);
  const std::vector<float> rows(4, row_grad);
  EncodeFloats(rows.data(), rows.size(), r->mutable_grad());
  return req;
}

// Runs one transaction over `req`: Prepare, then Commit unless it is a
// duplicate or `commit` is false. Returns Prepare's status.
absl::Status Run(Shard* shard, const PushRequest& req, PushResponse* resp,
                 bool commit = true, bool* duplicate = nullptr) {
  const std::vector<Payload> grads = ShardStore::PayloadsOf(req);
  const std::vector<Payload> rows = TableStore::PayloadsOf(req);
  PushTransaction push(shard->context, req);
  absl::Status s = push.Prepare(grads, rows);
  if (duplicate != nullptr) *duplicate = s.ok() && push.duplicate();
  if (s.ok() && !push.duplicate() && commit) push.Commit(resp);
  return s;
}

void Register(Shard* shard) {
  WorkerRef ref;
  ref.set_worker_id(0);
  ref.set_incarnation(1);
  REQUIRE_OK(shard->workers->Admit(ref).status());
}

TEST_CASE("a push refused in Prepare applies nothing and frees its seq") {
  Shard shard;
  Register(&shard);
  const uint64_t reserved = shard.store->Size().reserved_bytes;
  PushResponse resp;
  // Valid slices, a NaN row gradient: refused whole.
  absl::Status s = Run(&shard, MakePush(5, NAN), &resp);
  REQUIRE(absl::IsInvalidArgument(s));
  REQUIRE(resp.results_size() == 0);
  REQUIRE(resp.row_results_size() == 0);
  REQUIRE(shard.W() == std::vector<float>(4, 1.0f));
  REQUIRE(shard.store->Size().table_rows == 0);
  REQUIRE(shard.store->Size().reserved_bytes == reserved);
  REQUIRE(shard.BadInput() == 1);
  // The same seq again, with a valid payload: applied, not a duplicate.
  bool duplicate = true;
  REQUIRE_OK(Run(&shard, MakePush(5), &resp, true, &duplicate));
  REQUIRE_FALSE(duplicate);
  REQUIRE(shard.W() == std::vector<float>(4, 0.5f));
  REQUIRE(resp.results(0).outcome() == APPLIED);
  REQUIRE(resp.row_results(0).applied() == 2);
  REQUIRE(resp.row_results(0).rows_created() == 2);
  REQUIRE(shard.store->Size().table_rows == 2);
}

TEST_CASE(
    "a malformed caller is refused before the payload is looked at, known "
    "worker or not") {
  Shard shard;
  for (bool registered : {false, true}) {
    if (registered) Register(&shard);
    INFO((registered ? "registered" : "unknown") << " worker id");
    // A malformed reference and seq with an unknown tensor, a wrong-length
    // gradient: the caller is what is reported.
    PushRequest unknown = MakePush(5);
    unknown.mutable_grads(0)->set_tensor("nope");
    unknown.mutable_worker()->set_incarnation(0);
    PushRequest short_grad = MakePush(5);
    short_grad.mutable_grads(0)->mutable_grad()->resize(4);
    short_grad.mutable_worker()->set_clock(-1);
    PushRequest no_seq = MakePush(0);
    no_seq.mutable_grads(0)->set_tensor("");
    PushResponse resp;
    absl::Status s = Run(&shard, unknown, &resp);
    CHECK(absl::IsInvalidArgument(s));
    CHECK_THAT(std::string(s.message()),
               Catch::Contains("malformed worker reference"));
    s = Run(&shard, short_grad, &resp);
    CHECK(absl::IsInvalidArgument(s));
    CHECK_THAT(std::string(s.message()),
               Catch::Contains("malformed worker reference"));
    s = Run(&shard, no_seq, &resp);
    CHECK(absl::IsInvalidArgument(s));
    CHECK_THAT(std::string(s.message()), Catch::Contains("seq"));
  }
  CHECK(shard.BadInput() == 6);
  CHECK(shard.W() == std::vector<float>(4, 1.0f));
  CHECK(shard.store->Size().table_rows == 0);
  const std::vector<WorkerInfo> workers = shard.workers->Workers();
  REQUIRE(workers.size() == 1);  // the one Register admitted
  CHECK(workers[0].pushes == 0);
}

TEST_CASE("a prepared push dropped before Commit gives everything back") {
  Shard shard;
  Register(&shard);
  const uint64_t reserved = shard.store->Size().reserved_bytes;
  {
    const PushRequest req = MakePush(9);
    const std::vector<Payload> grads = ShardStore::PayloadsOf(req);
    const std::vector<Payload> rows = TableStore::PayloadsOf(req);
    PushTransaction push(shard.context, req);
    REQUIRE_OK(push.Prepare(grads, rows));
    REQUIRE_FALSE(push.duplicate());
    // Prepared: the two new rows' memory is held, nothing applied.
    REQUIRE(shard.store->Size().reserved_bytes > reserved);
    REQUIRE(shard.W() == std::vector<float>(4, 1.0f));
  }
  REQUIRE(shard.store->Size().reserved_bytes == reserved);
  REQUIRE(shard.store->Size().table_rows == 0);
  REQUIRE(shard.W() == std::vector<float>(4, 1.0f));
  REQUIRE(shard.BadInput() == 0);
  // The seq is free again.
  PushResponse resp;
  bool duplicate = true;
  REQUIRE_OK(Run(&shard, MakePush(9), &resp, true, &duplicate));
  REQUIRE_FALSE(duplicate);
  REQUIRE(shard.W() == std::vector<float>(4, 0.5f));
}

TEST_CASE("a committed push is applied once; its retry is a duplicate") {
  Shard shard;
  Register(&shard);
  PushResponse first;
  REQUIRE_OK(Run(&shard, MakePush(3), &first));
  REQUIRE(shard.W() == std::vector<float>(4, 0.5f));
  const std::vector<float> rows =
      testing::PullRows(shard.store.get(), "emb", {1, 2})->values;
  REQUIRE(rows == std::vector<float>(4, -1.0f));
  PushResponse again;
  bool duplicate = false;
  REQUIRE_OK(Run(&shard, MakePush(3), &again, true, &duplicate));
  REQUIRE(duplicate);
  REQUIRE(again.results_size() == 0);
  REQUIRE(shard.W() == std::vector<float>(4, 0.5f));
  REQUIRE(testing::PullRows(shard.store.get(), "emb", {1, 2})->values == rows);
}

TEST_CASE("a push read before a restart is refused whole and settled") {
  Shard shard;
  Register(&shard);
  PushRequest req = MakePush(4);
  req.set_read_epoch(kEpoch + 1);              // another process of this shard
  req.mutable_grads(0)->set_read_version(50);  // from that process's future
  PushResponse resp;
  REQUIRE_OK(Run(&shard, req, &resp));
  REQUIRE(resp.results_size() == 1);
  REQUIRE(resp.results(0).outcome() == REFUSED_RESTORED);
  REQUIRE(resp.row_results(0).refused_restored() == 2);
  REQUIRE(resp.row_results(0).applied() == 0);
  REQUIRE(shard.W() == std::vector<float>(4, 1.0f));
  REQUIRE(shard.store->Size().table_rows == 0);
  // Settled: its retry gets the answer of a duplicate, nothing more.
  bool duplicate = false;
  PushResponse again;
  REQUIRE_OK(Run(&shard, req, &again, true, &duplicate));
  REQUIRE(duplicate);
}

TEST_CASE("an assign is applied once, whatever epoch it names") {
  Shard shard;
  Register(&shard);
  PushRequest req = MakePush(5);
  req.set_assign(true);
  req.set_read_epoch(kEpoch + 1);  // ignored: an assign was read from nothing
  req.clear_rows();
  const std::vector<float> values = {2, 3, 4, 5};
  EncodeFloats(values.data(), values.size(),
               req.mutable_grads(0)->mutable_grad());
  PushResponse resp;
  REQUIRE_OK(Run(&shard, req, &resp));
  REQUIRE(resp.results(0).outcome() == APPLIED);
  REQUIRE(shard.W() == values);
  // A push in between, then the assign's retry: a duplicate, so the push
  // is not overwritten.
  PushRequest push = MakePush(6);
  push.clear_rows();
  REQUIRE_OK(Run(&shard, push, &resp));
  const std::vector<float> pushed = {1.5f, 2.5f, 3.5f, 4.5f};
  REQUIRE(shard.W() == pushed);
  bool duplicate = false;
  PushResponse again;
  REQUIRE_OK(Run(&shard, req, &again, true, &duplicate));
  REQUIRE(duplicate);
  REQUIRE(shard.W() == pushed);

  SECTION(
      "rows are assigned, created where missing; a repeated id is refused") {
    PushRequest rows = MakePush(7, 9.0f);  // rows 1 and 2 of "emb" := 9
    rows.set_assign(true);
    rows.mutable_rows(0)->add_ids(1);  // row 1 twice
    const std::vector<float> three(6, 9.0f);
    EncodeFloats(three.data(), three.size(),
                 rows.mutable_rows(0)->mutable_grad());
    const absl::Status s = Run(&shard, rows, &resp);
    REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(s.message().find("row 1 of table 'emb' appears twice") !=
            std::string::npos);
    REQUIRE(shard.W() == pushed);
    REQUIRE(shard.store->Size().table_rows == 0);
    // The seq was given back: the corrected assign may use it.
    rows = MakePush(7, 9.0f);
    rows.set_assign(true);
    PushResponse assigned;
    REQUIRE_OK(Run(&shard, rows, &assigned, true, &duplicate));
    REQUIRE_FALSE(duplicate);
    REQUIRE(shard.W() == std::vector<float>(4, 0.5f));
    REQUIRE(assigned.row_results(0).applied() == 2);
    REQUIRE(assigned.row_results(0).rows_created() == 2);
    const testing::PulledRows got =
        *testing::PullRows(shard.store.get(), "emb", {1, 2});
    REQUIRE(got.values == std::vector<float>(4, 9.0f));
    REQUIRE(got.versions == std::vector<uint64_t>{1, 1});
    // Rows that exist: replaced, one version more.
    rows = MakePush(8, 3.0f);
    rows.set_assign(true);
    REQUIRE_OK(Run(&shard, rows, &assigned));
    const testing::PulledRows again =
        *testing::PullRows(shard.store.get(), "emb", {2, 1});
    REQUIRE(again.values == std::vector<float>(4, 3.0f));
    REQUIRE(again.versions == std::vector<uint64_t>{2, 2});
  }
}

TEST_CASE("an unregistered caller's bad push registers nobody") {
  Shard shard;
  PushResponse resp;
  REQUIRE(absl::IsInvalidArgument(Run(&shard, MakePush(1, NAN), &resp)));
  WorkerRef ref;
  ref.set_worker_id(0);
  ref.set_incarnation(1);
  REQUIRE_FALSE(shard.workers->IsCurrent(ref));
  REQUIRE(shard.BadInput() == 1);
}

TEST_CASE("a checkpoint waits for an open push") {
  Shard shard;
  Register(&shard);
  const PushRequest req = MakePush(2);
  const std::vector<Payload> grads = ShardStore::PayloadsOf(req);
  const std::vector<Payload> rows = TableStore::PayloadsOf(req);
  std::atomic<bool> closed{false};
  std::thread checkpoint;
  {
    PushTransaction push(shard.context, req);
    REQUIRE_OK(push.Prepare(grads, rows));
    checkpoint = std::thread([&] {
      PushGate::Closed gate(&shard.gate);
      closed = true;
    });
    absl::SleepFor(absl::Milliseconds(200));
    REQUIRE_FALSE(closed);
    PushResponse resp;
    push.Commit(&resp);
    REQUIRE_FALSE(closed);  // still open until the transaction ends
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!closed && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(5));
  checkpoint.join();
  REQUIRE(closed);
  REQUIRE(shard.W() == std::vector<float>(4, 0.5f));
}

}  // namespace
}  // namespace asyncps
