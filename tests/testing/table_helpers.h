#ifndef ASYNCPS_TESTS_TESTING_TABLE_HELPERS_H_
#define ASYNCPS_TESTS_TESTING_TABLE_HELPERS_H_

// Short forms of sparse-table operations on a ShardStore, for tests and
// benchmarks: specs, and pulls and pushes of one table's rows through the
// same request path a shard uses (float32 payloads in the protobuf fields).

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/shard_map.h"
#include "store/shard_store.h"
#include "tests/testing/store_helpers.h"

namespace asyncps {
namespace testing {

// Adam as the table tests use it (lr 0.01, betas 0.9 / 0.999).
inline OptimizerSpec AdamSpec() {
  OptimizerSpec o;
  o.set_type(OPT_ADAM);
  o.set_learning_rate(0.01f);
  o.set_beta1(0.9f);
  o.set_beta2(0.999f);
  o.set_epsilon(1e-8f);
  return o;
}

// Adagrad as the table tests use it (lr 0.1, accumulator from 0.1).
inline OptimizerSpec AdagradSpec() {
  OptimizerSpec o;
  o.set_type(OPT_ADAGRAD);
  o.set_learning_rate(0.1f);
  o.set_epsilon(1e-6f);
  o.set_initial_accumulator(0.1f);
  return o;
}

inline TableSpec MakeTableSpec(const std::string& name, int dim,
                               OptimizerSpec optimizer,
                               Initializer init = INIT_UNIFORM,
                               float init_value = 0.05f, uint64_t seed = 7) {
  TableSpec t;
  t.set_name(name);
  t.set_dim(dim);
  t.set_init(init);
  t.set_init_value(init_value);
  t.set_seed(seed);
  *t.mutable_optimizer() = optimizer;
  return t;
}

// The first `n` ids from `start` upwards homed on `shard` of `shards` for
// `table` (common::RowHome).
inline std::vector<uint64_t> IdsOn(const std::string& table, int shard,
                                   int shards, size_t n, uint64_t start = 1) {
  std::vector<uint64_t> out;
  for (uint64_t id = start; out.size() < n; ++id) {
    if (ShardMap::Static(shards)->RowHome(table, id) == shard)
      out.push_back(id);
  }
  return out;
}

inline absl::Status CreateTable(ShardStore* store, const TableSpec& spec) {
  CreateTensorRequest req;
  *req.add_tables() = spec;
  return store->CreateTensors(req).status();
}

// What a pull of one table read.
struct PulledRows {
  std::vector<float> values;  // ids x dim
  std::vector<uint64_t> versions;
};

inline absl::StatusOr<PulledRows> PullRows(ShardStore* store,
                                           const std::string& table,
                                           const std::vector<uint64_t>& ids,
                                           int64_t clock = 0) {
  PullRequest req;
  req.mutable_worker()->set_clock(clock);
  TableIds* t = req.add_rows();
  t->set_table(table);
  for (uint64_t id : ids) t->add_ids(id);
  PullResponse resp;
  std::string bytes;
  absl::Status s = store->tables().Pull(req, clock, WIRE_F32, &resp,
                                        [&bytes](int, size_t n) {
                                          bytes.resize(n);
                                          return &bytes[0];
                                        });
  if (!s.ok()) return s;
  PulledRows out;
  out.values.resize(bytes.size() / sizeof(float));
  std::memcpy(out.values.data(), bytes.data(), bytes.size());
  out.versions.assign(resp.rows(0).versions().begin(),
                      resp.rows(0).versions().end());
  return out;
}

// Pushes float32 gradients (ids x dim) of one table with the read versions
// given (empty: all 0) at worker clock `clock`.
inline absl::StatusOr<RowsResult> PushRows(
    ShardStore* store, const std::string& table,
    const std::vector<uint64_t>& ids, const std::vector<float>& grads,
    const std::vector<uint64_t>& read_versions = {},
    const StalenessRule& rule = StalenessRule(), int64_t clock = 0,
    PushMode mode = PushMode::kApply) {
  PushRequest req;
  req.mutable_worker()->set_clock(clock);
  RowsGradient* g = req.add_rows();
  g->set_table(table);
  for (uint64_t id : ids) g->add_ids(id);
  for (uint64_t v : read_versions) g->add_read_versions(v);
  g->set_grad(std::string(reinterpret_cast<const char*>(grads.data()),
                          grads.size() * sizeof(float)));
  PushResponse resp;
  absl::Status s = ApplyPush(store, req, rule, &resp, mode);
  if (!s.ok()) return s;
  return resp.row_results(0);
}

}  // namespace testing
}  // namespace asyncps

#endif  // ASYNCPS_TESTS_TESTING_TABLE_HELPERS_H_
