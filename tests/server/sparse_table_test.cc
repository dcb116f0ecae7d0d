// Sparse tables in the shard store: creation rules, deterministic rows,
// exact optimizer arithmetic, duplicate ids, bad input, the memory cap, TTL
// eviction and the hash index under churn.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/row_initializer.h"
#include "common/shard_map.h"
#include "store/shard_store.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/store_helpers.h"
#include "tests/testing/table_helpers.h"

namespace asyncps {
namespace {

using testing::CreateTable;
using testing::IdsOn;
using testing::MakeTableSpec;
using testing::PulledRows;
using testing::PullRows;
using testing::PushRows;

OptimizerSpec Opt(OptimizerType type, float lr) {
  OptimizerSpec o;
  o.set_type(type);
  o.set_learning_rate(lr);
  if (type == OPT_MOMENTUM) o.set_momentum(0.9f);
  if (type == OPT_ADAM) {
    o.set_beta1(0.9f);
    o.set_beta2(0.999f);
    o.set_epsilon(1e-8f);
  }
  if (type == OPT_ADAGRAD) {
    o.set_epsilon(1e-6f);
    o.set_initial_accumulator(0.1f);
  }
  return o;
}

std::unique_ptr<ShardStore> Store(int shard = 0, int shards = 1,
                                  uint64_t cap = 0, int64_t ttl = 0) {
  ShardStoreOptions o;
  o.shard_index = shard;
  o.num_shards = shards;
  o.max_parameter_bytes = cap;
  o.row_ttl_steps = ttl;
  return ShardStore::Create(o).value();
}

std::vector<float> InitialRow(const TableSpec& spec, uint64_t id) {
  std::vector<float> out(spec.dim());
  RowInitializer(spec).Fill(id, out.data());
  return out;
}

TEST_CASE("tables are created idempotently, sharing the tensors' namespace",
          "[tables]") {
  auto store = Store();
  const TableSpec t = MakeTableSpec("emb", 8, Opt(OPT_ADAGRAD, 0.1f));
  CreateTensorRequest req;
  *req.add_tables() = t;
  absl::StatusOr<CreateTensorResponse> r = store->CreateTensors(req);
  REQUIRE_OK(r.status());
  REQUIRE(r->created() == 1);
  REQUIRE(r->tables_size() == 1);
  r = store->CreateTensors(req);  // identical: a no-op
  REQUIRE_OK(r.status());
  REQUIRE(r->created() == 0);

  TableSpec other = t;
  other.set_dim(16);
  CreateTensorRequest conflict;
  *conflict.add_tables() = other;
  r = store->CreateTensors(conflict);
  REQUIRE(absl::IsAlreadyExists(r.status()));
  REQUIRE(r.status().message().find("dim") != std::string::npos);

  // A tensor of the table's name, and a table of a tensor's name.
  CreateTensorRequest tensor;
  TensorSpec* d = tensor.add_tensors();
  d->set_name("emb");
  d->add_shape(4);
  *d->mutable_optimizer() = Opt(OPT_SGD, 0.1f);
  REQUIRE(absl::IsAlreadyExists(store->CreateTensors(tensor).status()));
  d->set_name("dense");
  REQUIRE_OK(store->CreateTensors(tensor).status());
  CreateTensorRequest clash;
  *clash.add_tables() = MakeTableSpec("dense", 4, Opt(OPT_SGD, 0.1f));
  REQUIRE(absl::IsAlreadyExists(store->CreateTensors(clash).status()));

  // All-or-nothing: a bad table in a request creates none of its tensors.
  CreateTensorRequest mixed;
  TensorSpec* ok = mixed.add_tensors();
  ok->set_name("later");
  ok->add_shape(4);
  *ok->mutable_optimizer() = Opt(OPT_SGD, 0.1f);
  *mixed.add_tables() = MakeTableSpec("bad", 0, Opt(OPT_SGD, 0.1f));
  REQUIRE(absl::IsInvalidArgument(store->CreateTensors(mixed).status()));
  REQUIRE(store->ListTensors().size() == 1);
  REQUIRE(store->tables().List().size() == 1);
}

TEST_CASE("bad table specs are refused naming the field", "[tables]") {
  auto store = Store();
  struct Case {
    TableSpec spec;
    std::string words;
  };
  std::vector<Case> cases;
  cases.push_back({MakeTableSpec("d0", 0, Opt(OPT_SGD, 0.1f)), "dim"});
  cases.push_back(
      {MakeTableSpec("d1", kMaxTableDim + 1, Opt(OPT_SGD, 0.1f)), "dim"});
  cases.push_back(
      {MakeTableSpec("g", 4, Opt(OPT_SGD, 0.1f), INIT_GLOROT_UNIFORM),
       "fan-in"});
  cases.push_back(
      {MakeTableSpec("lr", 4, Opt(OPT_SGD, 0.0f)), "learning_rate"});
  OptimizerSpec bad_acc = Opt(OPT_ADAGRAD, 0.1f);
  bad_acc.set_initial_accumulator(-1);
  cases.push_back({MakeTableSpec("acc", 4, bad_acc), "initial_accumulator"});
  cases.push_back({MakeTableSpec("", 4, Opt(OPT_SGD, 0.1f)), "name"});
  cases.push_back(
      {MakeTableSpec("nan", 4, Opt(OPT_SGD, 0.1f), INIT_NORMAL, std::nanf("")),
       "init_value"});
  for (const Case& c : cases) {
    const absl::Status s = CreateTable(store.get(), c.spec);
    INFO(c.words << ": " << s.ToString());
    REQUIRE(absl::IsInvalidArgument(s));
    REQUIRE(s.message().find(c.words) != std::string::npos);
  }
  REQUIRE(store->tables().List().empty());
}

TEST_CASE("a row's initial values are a pure function of (spec, id)",
          "[tables]") {
  const TableSpec spec =
      MakeTableSpec("emb", 6, Opt(OPT_SGD, 0.1f), INIT_NORMAL, 0.5f, 42);
  // Row 12345 on a single shard, on each shard of 3 that is its home, in
  // different creation orders and in a fresh store (a restart).
  const uint64_t id = 12345;
  const std::vector<float> expected = InitialRow(spec, id);
  auto one = Store();
  REQUIRE_OK(CreateTable(one.get(), spec));
  PulledRows a = *PullRows(one.get(), "emb", {id});
  REQUIRE(a.values == expected);
  REQUIRE(a.versions == std::vector<uint64_t>{0});

  const int home = ShardMap::Static(3)->RowHome("emb", id);
  auto three = Store(home, 3);
  REQUIRE_OK(CreateTable(three.get(), spec));
  std::vector<uint64_t> before = IdsOn("emb", home, 3, 50);
  REQUIRE_OK(PullRows(three.get(), "emb", before).status());
  REQUIRE(PullRows(three.get(), "emb", {id})->values == expected);

  auto restarted = Store(home, 3);
  REQUIRE_OK(CreateTable(restarted.get(), spec));
  REQUIRE(PullRows(restarted.get(), "emb", {id})->values == expected);

  // Statistics of the initializer: the values look like N(0, 0.5^2), and
  // another seed gives other values.
  TableSpec big = spec;
  big.set_dim(4000);
  const std::vector<float> many = InitialRow(big, 1);
  double sum = 0, sq = 0;
  for (float v : many) {
    sum += v;
    sq += v * v;
  }
  REQUIRE(std::abs(sum / many.size()) < 0.05);
  REQUIRE(std::sqrt(sq / many.size()) == Approx(0.5).epsilon(0.05));
  TableSpec reseeded = spec;
  reseeded.set_seed(43);
  REQUIRE(InitialRow(reseeded, id) != expected);
  TableSpec uniform = big;
  uniform.set_init(INIT_UNIFORM);
  for (float v : InitialRow(uniform, 9)) {
    REQUIRE(v >= -0.5f);
    REQUIRE(v < 0.5f);
  }
}

// The arithmetic of every optimizer against a reference computed here.
TEST_CASE("pushed rows get exactly the optimizer's update", "[tables]") {
  const int dim = 4;
  const std::vector<uint64_t> ids = {7, 900, 31337};
  // Three pushes with known gradients.
  auto grad = [&](int step, size_t i, int d) {
    return 0.1f * static_cast<float>(step + 1) - 0.05f * static_cast<float>(i) +
           0.01f * static_cast<float>(d);
  };
  for (OptimizerType type : {OPT_SGD, OPT_MOMENTUM, OPT_ADAGRAD, OPT_ADAM}) {
    INFO("optimizer " << OptimizerType_Name(type));
    const OptimizerSpec opt = Opt(type, 0.05f);
    const TableSpec spec = MakeTableSpec("emb", dim, opt);
    auto store = Store();
    REQUIRE_OK(CreateTable(store.get(), spec));
    // Reference state per row: w, and up to two state buffers.
    std::vector<std::vector<float>> w, s1, s2;
    for (uint64_t id : ids) {
      w.push_back(InitialRow(spec, id));
      s1.push_back(std::vector<float>(
          dim, type == OPT_ADAGRAD ? opt.initial_accumulator() : 0.0f));
      s2.push_back(std::vector<float>(dim, 0.0f));
    }
    for (int step = 0; step < 3; ++step) {
      PulledRows read = *PullRows(store.get(), "emb", ids);
      std::vector<float> g(ids.size() * dim);
      for (size_t i = 0; i < ids.size(); ++i) {
        for (int d = 0; d < dim; ++d) g[i * dim + d] = grad(step, i, d);
      }
      absl::StatusOr<RowsResult> r =
          PushRows(store.get(), "emb", ids, g, read.versions);
      REQUIRE_OK(r.status());
      REQUIRE(r->applied() == ids.size());
      REQUIRE(r->rows_created() == 0);
      const float lr = opt.learning_rate();
      const double t = step + 1;
      for (size_t i = 0; i < ids.size(); ++i) {
        for (int d = 0; d < dim; ++d) {
          const float gi = g[i * dim + d];
          float& wi = w[i][d];
          switch (type) {
            case OPT_SGD:
              wi -= lr * gi;
              break;
            case OPT_MOMENTUM:
              s1[i][d] = opt.momentum() * s1[i][d] + gi;
              wi -= lr * s1[i][d];
              break;
            case OPT_ADAGRAD:
              s1[i][d] += gi * gi;
              wi -= lr * gi / (std::sqrt(s1[i][d]) + opt.epsilon());
              break;
            default: {
              const float b1 = opt.beta1(), b2 = opt.beta2();
              s1[i][d] = b1 * s1[i][d] + (1 - b1) * gi;
              s2[i][d] = b2 * s2[i][d] + (1 - b2) * gi * gi;
              const float c1 =
                  static_cast<float>(1.0 / (1.0 - std::pow(b1, t)));
              const float c2 =
                  static_cast<float>(1.0 / (1.0 - std::pow(b2, t)));
              wi -= lr * (s1[i][d] * c1) /
                    (std::sqrt(s2[i][d] * c2) + opt.epsilon());
            }
          }
        }
      }
    }
    PulledRows after = *PullRows(store.get(), "emb", ids);
    REQUIRE(after.versions == std::vector<uint64_t>(ids.size(), 3));
    for (size_t i = 0; i < ids.size(); ++i) {
      for (int d = 0; d < dim; ++d) {
        REQUIRE(after.values[i * dim + d] == Approx(w[i][d]).epsilon(1e-6));
      }
    }
  }
}

TEST_CASE("a peek reads rows without creating them", "[tables]") {
  const TableSpec spec = MakeTableSpec("emb", 3, Opt(OPT_SGD, 0.5f));
  auto store = Store();
  REQUIRE_OK(CreateTable(store.get(), spec));
  REQUIRE_OK(PushRows(store.get(), "emb", {1}, {1, 1, 1}).status());
  PullRequest req;
  TableIds* t = req.add_rows();
  t->set_table("emb");
  t->add_ids(1);
  t->add_ids(2);
  t->set_peek(true);
  PullResponse resp;
  std::vector<float> out(6);
  REQUIRE_OK(store->tables().Pull(req, 0, WIRE_F32, &resp, [&](int, size_t n) {
    REQUIRE(n == out.size() * sizeof(float));
    return reinterpret_cast<char*>(out.data());
  }));
  const std::vector<float> one = InitialRow(spec, 1), two = InitialRow(spec, 2);
  REQUIRE(out == std::vector<float>{one[0] - 0.5f, one[1] - 0.5f, one[2] - 0.5f,
                                    two[0], two[1], two[2]});
  REQUIRE(resp.rows(0).versions(0) == 1);
  REQUIRE(resp.rows(0).versions(1) == 0);
  REQUIRE(store->tables().totals().rows == 1);
}

TEST_CASE("a push of a row never pulled applies to its initial values",
          "[tables]") {
  const TableSpec spec = MakeTableSpec("emb", 3, Opt(OPT_SGD, 0.5f));
  auto store = Store();
  REQUIRE_OK(CreateTable(store.get(), spec));
  absl::StatusOr<RowsResult> r =
      PushRows(store.get(), "emb", {5}, {1.0f, 2.0f, -2.0f});
  REQUIRE_OK(r.status());
  REQUIRE(r->rows_created() == 1);
  REQUIRE(r->applied() == 1);
  const std::vector<float> init = InitialRow(spec, 5);
  PulledRows got = *PullRows(store.get(), "emb", {5});
  REQUIRE(got.values ==
          std::vector<float>{init[0] - 0.5f, init[1] - 1.0f, init[2] + 1.0f});
  REQUIRE(got.versions[0] == 1);
}

TEST_CASE(
    "duplicate ids: a pull answers each, a push sums them into one "
    "update",
    "[tables]") {
  const TableSpec spec = MakeTableSpec("emb", 2, Opt(OPT_ADAGRAD, 0.1f));
  auto store = Store();
  REQUIRE_OK(CreateTable(store.get(), spec));
  PulledRows twice = *PullRows(store.get(), "emb", {3, 4, 3});
  REQUIRE(twice.values.size() == 6);
  REQUIRE(twice.values[0] == twice.values[4]);
  REQUIRE(twice.values[1] == twice.values[5]);

  // Row 3 twice (gradients 1 and 2 per element), row 4 once.
  absl::StatusOr<RowsResult> r =
      PushRows(store.get(), "emb", {3, 4, 3}, {1, 1, 5, 5, 2, 2}, {0, 0, 0});
  REQUIRE_OK(r.status());
  REQUIRE(r->applied() == 2);  // distinct rows
  const std::vector<float> init = InitialRow(spec, 3);
  // One Adagrad step with g = 3: acc = 0.1 + 9.
  const float acc = 0.1f + 9.0f;
  const float expected = init[0] - 0.1f * 3.0f / (std::sqrt(acc) + 1e-6f);
  PulledRows after = *PullRows(store.get(), "emb", {3});
  REQUIRE(after.values[0] == Approx(expected).epsilon(1e-6));
  REQUIRE(after.versions[0] == 1);  // one update, not two
}

TEST_CASE("bad row input is refused and changes nothing",
          "[tables][bad_input]") {
  const TableSpec spec = MakeTableSpec("emb", 4, Opt(OPT_SGD, 0.1f));
  auto store = Store(0, 2);
  REQUIRE_OK(CreateTable(store.get(), spec));
  const std::vector<uint64_t> ids = IdsOn("emb", 0, 2, 3);
  const uint64_t elsewhere = IdsOn("emb", 1, 2, 1)[0];
  // Existing rows with one update each.
  PulledRows read = *PullRows(store.get(), "emb", ids);
  REQUIRE_OK(
      PushRows(store.get(), "emb", ids, std::vector<float>(12, 1.0f)).status());
  const PulledRows before = *PullRows(store.get(), "emb", ids);
  const uint64_t rows = store->tables().totals().rows;
  const uint64_t reserved = store->Size().reserved_bytes;

  const std::vector<float> good(12, 0.5f);
  std::vector<float> nan = good;
  nan[5] = std::nanf("");
  std::vector<float> inf = good;
  inf[0] = std::numeric_limits<float>::infinity();
  const uint64_t fresh = IdsOn("emb", 0, 2, 1, 1000000)[0];
  struct Case {
    std::string what;
    absl::StatusCode code;
    std::string table;
    std::vector<uint64_t> ids;
    std::vector<float> grads;
    std::vector<uint64_t> read;
  };
  const std::vector<Case> cases = {
      {"unknown table", absl::StatusCode::kNotFound, "nope", ids, good, {}},
      {"wrong dimension",
       absl::StatusCode::kInvalidArgument,
       "emb",
       ids,
       std::vector<float>(9, 0.5f),
       {}},
      {"NaN", absl::StatusCode::kInvalidArgument, "emb", ids, nan, {}},
      {"Inf", absl::StatusCode::kInvalidArgument, "emb", ids, inf, {}},
      {"ids and gradient of different lengths",
       absl::StatusCode::kInvalidArgument,
       "emb",
       {ids[0], ids[1]},
       good,
       {}},
      {"read_versions of another length",
       absl::StatusCode::kInvalidArgument,
       "emb",
       ids,
       good,
       {1, 1}},
      {"read_version from the future",
       absl::StatusCode::kInvalidArgument,
       "emb",
       ids,
       good,
       {1, 7, 1}},
      {"no ids", absl::StatusCode::kInvalidArgument, "emb", {}, {}, {}},
      {"a row of another shard",
       absl::StatusCode::kInvalidArgument,
       "emb",
       {ids[0], elsewhere, ids[2]},
       good,
       {}},
      // A new row with bad input elsewhere: not created either.
      {"new row with NaN",
       absl::StatusCode::kInvalidArgument,
       "emb",
       {fresh, ids[1], ids[2]},
       nan,
       {}},
  };
  for (const Case& c : cases) {
    absl::StatusOr<RowsResult> r =
        PushRows(store.get(), c.table, c.ids, c.grads, c.read);
    INFO(c.what << ": " << r.status().ToString());
    REQUIRE(r.status().code() == c.code);
  }
  // Oversized: more ids than a request may carry (a small limit here).
  {
    TableStoreOptions o;
    o.max_ids_per_table = 2;
    o.reserve = [](uint64_t, const std::string&) { return absl::OkStatus(); };
    o.release = [](uint64_t) {};
    TableStore small(o);
    CreateTensorRequest req;
    *req.add_tables() = spec;
    absl::StatusOr<TableStore::Staged> staged = small.Stage(req.tables());
    REQUIRE_OK(staged.status());
    small.Commit(&*staged);
    PullRequest pull;
    TableIds* t = pull.add_rows();
    t->set_table("emb");
    for (uint64_t id : {1, 2, 3}) t->add_ids(id);
    const absl::Status s = small.ValidatePull(pull);
    REQUIRE(absl::IsInvalidArgument(s));
    REQUIRE(s.message().find("at most 2") != std::string::npos);
  }
  // A table twice in one push.
  {
    PushRequest req;
    for (int k = 0; k < 2; ++k) {
      RowsGradient* g = req.add_rows();
      g->set_table("emb");
      g->add_ids(ids[0]);
      g->set_grad(std::string(16, '\0'));
    }
    PushResponse resp;
    REQUIRE(absl::IsInvalidArgument(
        testing::ApplyPush(store.get(), req, StalenessRule(), &resp)));
  }
  // Pulls: unknown table, no ids, another shard's row.
  REQUIRE(absl::IsNotFound(PullRows(store.get(), "nope", ids).status()));
  REQUIRE(absl::IsInvalidArgument(PullRows(store.get(), "emb", {}).status()));
  REQUIRE(absl::IsInvalidArgument(
      PullRows(store.get(), "emb", {elsewhere}).status()));

  const PulledRows after = *PullRows(store.get(), "emb", ids);
  REQUIRE(after.values == before.values);
  REQUIRE(after.versions == before.versions);
  REQUIRE(store->tables().totals().rows == rows);
  REQUIRE(store->Size().reserved_bytes == reserved);
  float probe[4];
  uint64_t version;
  REQUIRE_FALSE(store->tables().Find("emb")->Peek(fresh, probe, &version));
}

TEST_CASE("rows staler than the bound are refused; inverse scaling",
          "[tables][staleness]") {
  const TableSpec spec =
      MakeTableSpec("emb", 1, Opt(OPT_SGD, 1.0f), INIT_ZEROS);
  auto store = Store();
  REQUIRE_OK(CreateTable(store.get(), spec));
  for (int i = 0; i < 3; ++i) {
    REQUIRE_OK(PushRows(store.get(), "emb", {1}, {1.0f}, {0}).status());
  }
  // Version 3 now; a gradient read at version 0 has staleness 3.
  StalenessRule bound;
  bound.max_staleness = 2;
  absl::StatusOr<RowsResult> r =
      PushRows(store.get(), "emb", {1}, {1.0f}, {0}, bound);
  REQUIRE_OK(r.status());
  REQUIRE(r->refused_stale() == 1);
  REQUIRE(r->applied() == 0);
  REQUIRE(r->max_staleness() == 3);
  StalenessRule inverse;
  inverse.inverse_lr = true;
  r = PushRows(store.get(), "emb", {1}, {1.0f}, {1}, inverse);
  REQUIRE_OK(r.status());
  REQUIRE(r->applied() == 1);
  REQUIRE(r->scaled() == 1);
  // -1 -1 -1 (staleness 0, 1, 2 unscaled), then -1/(1+2).
  REQUIRE(PullRows(store.get(), "emb", {1})->values[0] ==
          Approx(-3.0f - 1.0f / 3.0f));

  // A push read before a restart is refused whole, and may name versions
  // the rows do not have.
  r = PushRows(store.get(), "emb", {1, 1, 2}, {1.0f, 1.0f, 1.0f}, {99, 99, 0},
               StalenessRule(), 0, PushMode::kRefuseRestored);
  REQUIRE_OK(r.status());
  REQUIRE(r->refused_restored() == 2);
  REQUIRE(PullRows(store.get(), "emb", {1})->versions[0] == 4);
  float probe[1];
  uint64_t version;
  REQUIRE_FALSE(store->tables().Find("emb")->Peek(2, probe, &version));
}

TEST_CASE(
    "a table that would exceed --max_parameter_bytes answers "
    "RESOURCE_EXHAUSTED and creates nothing",
    "[tables][memory]") {
  const TableSpec spec = MakeTableSpec("emb", 16, Opt(OPT_ADAGRAD, 0.1f));
  // Room for the table and about 100 rows.
  const uint64_t row = 16 * 4 * 2 + SparseTable::kRowOverheadBytes;
  auto store = Store(0, 1, SparseTable::kTableOverheadBytes + 100 * row);
  REQUIRE_OK(CreateTable(store.get(), spec));
  std::vector<uint64_t> ids;
  for (uint64_t i = 0; i < 80; ++i) ids.push_back(i);
  REQUIRE_OK(PullRows(store.get(), "emb", ids).status());
  REQUIRE(store->tables().totals().rows == 80);
  const uint64_t reserved = store->Size().reserved_bytes;

  std::vector<uint64_t> more;
  for (uint64_t i = 70; i < 110; ++i) more.push_back(i);  // 30 new rows
  absl::StatusOr<PulledRows> r = PullRows(store.get(), "emb", more);
  INFO(r.status().ToString());
  REQUIRE(absl::IsResourceExhausted(r.status()));
  REQUIRE(r.status().message().find("max_parameter_bytes") !=
          std::string::npos);
  REQUIRE(absl::IsResourceExhausted(
      PushRows(store.get(), "emb", more, std::vector<float>(40 * 16, 0.1f))
          .status()));
  REQUIRE(store->tables().totals().rows == 80);
  REQUIRE(store->Size().reserved_bytes == reserved);
  // Rows that exist are still served and updated.
  REQUIRE_OK(PushRows(store.get(), "emb", {1, 2}, std::vector<float>(32, 0.1f))
                 .status());
  REQUIRE(store->tables().Status()[0].rows() == 80);
}

TEST_CASE(
    "rows unused for --row_ttl_steps are evicted and come back "
    "initialized",
    "[tables][ttl]") {
  const TableSpec spec = MakeTableSpec("emb", 2, Opt(OPT_SGD, 1.0f));
  auto store = Store(0, 1, 0, /*ttl=*/10);
  REQUIRE_OK(CreateTable(store.get(), spec));
  const uint64_t empty = store->Size().reserved_bytes;
  REQUIRE_OK(PullRows(store.get(), "emb", {1, 2, 3}, /*clock=*/0).status());
  REQUIRE_OK(
      PushRows(store.get(), "emb", {1}, {1.0f, 1.0f}, {}, {}, 0).status());
  REQUIRE_OK(PullRows(store.get(), "emb", {2}, /*clock=*/15).status());
  REQUIRE(store->tables().EvictIdle(5) == 0);  // nothing idle that long
  // At clock 20, rows last used before clock 10 go: 1 and 3.
  REQUIRE(store->tables().EvictIdle(20) == 2);
  REQUIRE(store->tables().totals().rows == 1);
  REQUIRE(store->Size().reserved_bytes ==
          empty + store->tables().Find("emb")->row_bytes());
  const TableStatus st = store->tables().Status()[0];
  REQUIRE(st.rows_evicted() == 2);
  REQUIRE(st.rows_created() == 3);
  // Row 1 comes back with its initial values and version 0.
  PulledRows again = *PullRows(store.get(), "emb", {1}, 21);
  REQUIRE(again.values == InitialRow(spec, 1));
  REQUIRE(again.versions[0] == 0);
  // A gradient read before the eviction (version 1) is refused for that row.
  absl::StatusOr<RowsResult> r =
      PushRows(store.get(), "emb", {1}, {1.0f, 1.0f}, {1}, {}, 21);
  REQUIRE_OK(r.status());
  REQUIRE(r->refused_restored() == 1);
}

TEST_CASE(
    "a listener hears the ids of every eviction, and another store evicts "
    "exactly those (a replicated shard's backup)",
    "[tables][ttl][replication]") {
  const TableSpec spec = MakeTableSpec("emb", 2, Opt(OPT_SGD, 1.0f));
  auto primary = Store(0, 1, 0, /*ttl=*/10);
  auto backup = Store(0, 1, 0, /*ttl=*/10);
  std::vector<uint64_t> heard;
  bool heard_idle = false;
  primary->tables().set_eviction_listener(
      [&](absl::string_view table, absl::Span<const uint64_t> ids, bool idle) {
        CHECK(table == "emb");
        heard.insert(heard.end(), ids.begin(), ids.end());
        heard_idle = idle;
      });
  for (auto* store : {primary.get(), backup.get()}) {
    REQUIRE_OK(CreateTable(store, spec));
    REQUIRE_OK(PullRows(store, "emb", {1, 2, 3, 4}, /*clock=*/0).status());
    REQUIRE_OK(PullRows(store, "emb", {2}, /*clock=*/15).status());
  }
  REQUIRE(primary->tables().EvictIdle(20) == 3);
  std::sort(heard.begin(), heard.end());
  REQUIRE(heard == std::vector<uint64_t>{1, 3, 4});
  REQUIRE(heard_idle);
  // The backup evicts what it is told (and skips ids it does not hold),
  // gives the bytes back and counts them idle, as the primary did.
  heard.push_back(99);
  absl::StatusOr<uint64_t> n = backup->tables().EvictRows("emb", heard, true);
  REQUIRE_OK(n.status());
  REQUIRE(*n == 3);
  REQUIRE(backup->Size().reserved_bytes == primary->Size().reserved_bytes);
  REQUIRE(backup->tables().Status()[0].rows_evicted_idle() == 3);
  REQUIRE(backup->tables().Status()[0].rows() == 1);
  REQUIRE(absl::IsInvalidArgument(
      backup->tables().EvictRows("nope", heard, true).status()));
}

TEST_CASE("the hash index stays right through growth and eviction churn",
          "[tables]") {
  const TableSpec spec =
      MakeTableSpec("emb", 1, Opt(OPT_SGD, 1.0f), INIT_CONSTANT, 0.0f);
  auto store = Store(0, 1, 0, /*ttl=*/1);
  REQUIRE_OK(CreateTable(store.get(), spec));
  std::mt19937_64 rng(5);
  std::vector<uint64_t> kept, dropped;
  for (int i = 0; i < 60000; ++i) {
    (i % 3 == 0 ? dropped : kept).push_back(rng());
  }
  // Every kept row gets its index + 1 pushed (value -(i + 1)), at clock 100;
  // dropped rows are only pulled, at clock 0, and then evicted.
  REQUIRE_OK(PullRows(store.get(), "emb", dropped, 0).status());
  std::vector<float> g(kept.size());
  for (size_t i = 0; i < kept.size(); ++i) g[i] = static_cast<float>(i + 1);
  REQUIRE_OK(PushRows(store.get(), "emb", kept, g, {}, {}, 100).status());
  REQUIRE(store->tables().EvictIdle(100) == dropped.size());
  const SparseTable* t = store->tables().Find("emb");
  float v;
  uint64_t version;
  for (size_t i = 0; i < kept.size(); ++i) {
    REQUIRE(t->Peek(kept[i], &v, &version));
    REQUIRE(v == -static_cast<float>(i + 1));
  }
  for (uint64_t id : dropped) REQUIRE_FALSE(t->Peek(id, &v, &version));
  // Freed rows are reused without disturbing the others.
  REQUIRE_OK(PullRows(store.get(), "emb", dropped, 200).status());
  REQUIRE(store->tables().totals().rows == kept.size() + dropped.size());
  REQUIRE(t->Peek(kept.back(), &v, &version));
  REQUIRE(v == -static_cast<float>(kept.size()));
}

TEST_CASE("rows spread over shards within a few percent, Zipf ids included",
          "[tables][sharding]") {
  std::mt19937_64 rng(3);
  // Distinct ids drawn Zipf-like (many small, a long tail) and sequential.
  std::vector<uint64_t> ids;
  std::uniform_real_distribution<double> u(0, 1);
  for (int i = 0; i < 200000; ++i) {
    ids.push_back(static_cast<uint64_t>(std::pow(1e7, u(rng))));
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  for (int shards : {2, 3, 8}) {
    std::vector<int64_t> count(shards, 0);
    for (uint64_t id : ids)
      ++count[ShardMap::Static(shards)->RowHome("field_3", id)];
    const double mean = static_cast<double>(ids.size()) / shards;
    for (int64_t c : count) {
      INFO(shards << " shards: " << c << " of mean " << mean);
      REQUIRE(std::abs(c - mean) / mean < 0.02);
    }
  }
}

}  // namespace
}  // namespace asyncps
