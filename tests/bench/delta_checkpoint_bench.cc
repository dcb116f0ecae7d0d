// delta_checkpoint_bench: incremental checkpoints (server/checkpoint_delta.h)
// against full ones, measured in the same run on the same store:
//   - bytes written by a delta when a share (--changed, 1%) of the rows
//     changed since the previous checkpoint, over the bytes of a full one;
//   - restore time of the full checkpoint plus --deltas (10) deltas over
//     that of the full checkpoint alone.
//
// Store: one shard of one, one sparse table of --rows rows of --dim floats
// with Adagrad (one state buffer), all rows created and pushed once, plus
// the 784-256-128-10 MLP (momentum) whose slices all change every interval.
// Every interval pushes to --changed of the rows (a random sample) and to
// every dense slice, then writes a delta as ps_server's checkpointer does
// (change epoch advanced, then captured). Restores read from the page cache
// (right after the writes), so restore_ms is CPU (CRC, parse, copies).
// Each restore figure is the median of --reps runs. Output:
//   rows=... full_bytes=... delta_bytes=... (mean) delta_ratio=...
//   full_write_ms=... delta_write_ms=... full_restore_ms=...
//   chain_restore_ms=... restore_ratio=...
// and the cost of tracking changes on the request path: rows per second of
// pushes and pulls (4096 random ids of --rows existing ones) on a table
// whose rows are stamped with a change epoch and on one whose are not,
// interleaved (each first in turn), median of --reps x 5 rounds:
//   stamp_push_rows_per_s=... plain_push_rows_per_s=... push_ratio=...
//   stamp_pull_rows_per_s=... plain_pull_rows_per_s=... pull_ratio=...

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "server/checkpoint.h"
#include "server/checkpoint_delta.h"
#include "store/change_epoch.h"
#include "store/shard_store.h"
#include "store/sparse_table.h"
#include "tests/bench/bench_util.h"
#include "tests/testing/table_helpers.h"

ABSL_FLAG(std::string, dir, "",
          "Directory for the files ($TEST_TMPDIR or /tmp when empty).");
ABSL_FLAG(int64_t, rows, 500000, "Rows of the table.");
ABSL_FLAG(int, dim, 32, "Floats per row.");
ABSL_FLAG(double, changed, 0.01, "Share of the rows pushed per interval.");
ABSL_FLAG(int, deltas, 10, "Deltas after the full checkpoint.");
ABSL_FLAG(int, reps, 3, "Restores per figure (median).");

namespace asyncps {
namespace {

constexpr size_t kBatch = 65536;

void Check(const absl::Status& s) {
  if (s.ok()) return;
  std::fprintf(stderr, "%s\n", s.ToString().c_str());
  std::exit(1);
}

std::unique_ptr<ShardStore> EmptyStore() {
  ShardStoreOptions o;
  o.track_removed_rows = true;
  return ShardStore::Create(o).value();
}

void CreateModel(ShardStore* store, int dim) {
  CreateTensorRequest req;
  OptimizerSpec momentum;
  momentum.set_type(OPT_MOMENTUM);
  momentum.set_learning_rate(0.01f);
  momentum.set_momentum(0.9f);
  for (const auto& [name, shape] :
       std::vector<std::pair<std::string, std::vector<int64_t>>>{
           {"w1", {784, 256}}, {"w2", {256, 128}}, {"w3", {128, 10}}}) {
    TensorSpec* t = req.add_tensors();
    t->set_name(name);
    for (int64_t d : shape) t->add_shape(d);
    t->set_init(INIT_UNIFORM);
    t->set_init_value(0.05f);
    *t->mutable_optimizer() = momentum;
  }
  OptimizerSpec adagrad;
  adagrad.set_type(OPT_ADAGRAD);
  adagrad.set_learning_rate(0.05f);
  adagrad.set_epsilon(1e-6f);
  adagrad.set_initial_accumulator(0.1f);
  *req.add_tables() = testing::MakeTableSpec("emb", dim, adagrad);
  Check(store->CreateTensors(req).status());
}

// Pushes a gradient to `ids` (in batches) and to every dense slice.
void Push(ShardStore* store, const std::vector<uint64_t>& ids, int dim,
          int64_t clock) {
  std::vector<float> g;
  for (size_t at = 0; at < ids.size(); at += kBatch) {
    const std::vector<uint64_t> batch(
        ids.begin() + at, ids.begin() + std::min(ids.size(), at + kBatch));
    g.assign(batch.size() * dim, 0.01f * static_cast<float>(clock % 7 + 1));
    Check(testing::PushRows(store, "emb", batch, g, {}, {}, clock).status());
  }
  PushRequest req;
  for (const TensorSpec& spec : store->ListTensors()) {
    int64_t elems = 1;
    for (int64_t d : spec.shape()) elems *= d;
    const int64_t slice = 4096;
    for (int64_t s = 0; s * slice < elems; ++s) {
      SliceGradient* sg = req.add_grads();
      sg->set_tensor(spec.name());
      sg->set_slice(static_cast<uint32_t>(s));
      const std::vector<float> v(std::min(slice, elems - s * slice), 0.001f);
      EncodeFloats(v.data(), v.size(), sg->mutable_grad());
    }
  }
  PushResponse resp;
  Check(testing::ApplyPush(store, req, StalenessRule{}, &resp));
}

struct Written {
  CheckpointInfo info;
  uint32_t crc = 0;
};

// Advances the change epoch and writes a full checkpoint (chain null) or
// a delta of what changed since `since`, as ps_server's checkpointer does.
Written Write(ShardStore* store, const std::string& dir,
              const DeltaChain* chain, uint32_t* since) {
  const uint32_t epoch = store->AdvanceChangeEpoch();
  const CheckpointImage image =
      chain == nullptr ? CaptureCheckpoint(*store, {}, absl::Now())
                       : CaptureDelta(*store, {}, absl::Now(), *since, *chain);
  *since = epoch;
  Written w;
  absl::StatusOr<CheckpointInfo> info =
      WriteCheckpoint(image, dir, Clock::Real(), nullptr, &w.crc);
  Check(info.status());
  w.info = *info;
  return w;
}

double RestoreMs(const std::string& path,
                 const std::vector<std::string>& deltas, int64_t rows) {
  std::unique_ptr<ShardStore> store = EmptyStore();
  RestoreCheckpointOptions o;
  o.deltas = deltas;
  absl::StatusOr<RestoredCheckpoint> r =
      RestoreCheckpoint(path, store.get(), o);
  Check(r.status());
  if (r->info.deltas_applied() != static_cast<int>(deltas.size()) ||
      static_cast<int64_t>(r->info.rows()) != rows) {
    std::fprintf(stderr, "restored %d deltas and %llu rows\n",
                 r->info.deltas_applied(),
                 static_cast<unsigned long long>(r->info.rows()));
    std::exit(1);
  }
  return r->info.duration_ms();
}

// Rows per second of `rounds` pushes (or pulls) of `batch` ids to `table`.
double RowsPerS(SparseTable* table,
                const std::vector<std::vector<uint64_t>>& batches, bool push,
                int64_t* clock) {
  SparseTable::Batch b;
  std::vector<float> grads;
  std::vector<char> out;
  std::vector<uint64_t> versions;
  uint64_t rows = 0;
  const absl::Time start = absl::Now();
  for (const std::vector<uint64_t>& ids : batches) {
    ++*clock;
    table->Find(ids, &b);
    if (push) {
      grads.assign(ids.size() * table->dim(), 0.001f);
      table->Apply(ids, &b, {}, grads.data(), StalenessRule{}, *clock);
    } else {
      out.resize(ids.size() * table->dim() * sizeof(float));
      versions.resize(ids.size());
      table->Read(ids, &b, *clock, WIRE_F32, out.data(), versions.data());
    }
    rows += ids.size();
  }
  return rows / absl::ToDoubleSeconds(absl::Now() - start);
}

// Prints the request-path cost of change stamps (see the header).
void StampCost(int64_t rows, int dim) {
  OptimizerSpec adagrad;
  adagrad.set_type(OPT_ADAGRAD);
  adagrad.set_learning_rate(0.05f);
  adagrad.set_epsilon(1e-6f);
  adagrad.set_initial_accumulator(0.1f);
  const TableSpec spec = testing::MakeTableSpec("emb", dim, adagrad);
  const auto map = std::make_shared<const ServedMap>(*ShardMap::Static(1));
  ChangeEpoch epoch;
  SparseTable stamped(spec, 0, map, &epoch, true);
  SparseTable plain(spec, 0, map, nullptr, false);
  std::mt19937_64 rng(7);
  std::vector<std::vector<uint64_t>> all, batches;
  for (int64_t at = 0; at < rows; at += 4096) {
    all.emplace_back();
    for (int64_t i = at; i < std::min(rows, at + 4096); ++i) {
      all.back().push_back(1 + static_cast<uint64_t>(i));
    }
  }
  for (int i = 0; i < 200; ++i) {
    batches.emplace_back(4096);
    for (uint64_t& id : batches.back()) id = 1 + rng() % rows;
  }
  int64_t clock = 0;
  RowsPerS(&stamped, all, true, &clock);  // every row created
  RowsPerS(&plain, all, true, &clock);
  std::vector<double> sp, pp, sr, pr;
  for (int r = 0; r < 5 * std::max(1, absl::GetFlag(FLAGS_reps)); ++r) {
    epoch.Advance();  // as a checkpoint between intervals
    // Each first in turn.
    for (bool stamps : {r % 2 == 0, r % 2 != 0}) {
      (stamps ? sp : pp)
          .push_back(
              RowsPerS(stamps ? &stamped : &plain, batches, true, &clock));
    }
    for (bool stamps : {r % 2 == 0, r % 2 != 0}) {
      (stamps ? sr : pr)
          .push_back(
              RowsPerS(stamps ? &stamped : &plain, batches, false, &clock));
    }
  }
  const double a = Median(sp), b = Median(pp), c = Median(sr), d = Median(pr);
  std::printf(
      "stamp_push_rows_per_s=%.0f plain_push_rows_per_s=%.0f push_ratio=%.3f "
      "stamp_pull_rows_per_s=%.0f plain_pull_rows_per_s=%.0f "
      "pull_ratio=%.3f\n",
      a, b, a / b, c, d, c / d);
  std::fflush(stdout);
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string dir = BenchDir(absl::GetFlag(FLAGS_dir));
  const int64_t rows = absl::GetFlag(FLAGS_rows);
  const int dim = absl::GetFlag(FLAGS_dim);
  std::unique_ptr<ShardStore> store = EmptyStore();
  CreateModel(store.get(), dim);
  std::vector<uint64_t> ids(rows);
  for (int64_t i = 0; i < rows; ++i)
    ids[i] = 1 + 7919 * static_cast<uint64_t>(i);
  Push(store.get(), ids, dim, 1);

  uint32_t since = 0;
  const Written full = Write(store.get(), dir, nullptr, &since);
  DeltaChain chain;
  chain.base_crc = full.crc;
  chain.base_bytes = full.info.bytes();
  chain.base_unix_time_ms = full.info.unix_time_ms();
  std::mt19937_64 rng(42);
  const size_t changed =
      static_cast<size_t>(absl::GetFlag(FLAGS_changed) * rows);
  std::vector<std::string> deltas;
  double delta_bytes = 0, delta_write_ms = 0;
  const int n = std::max(1, absl::GetFlag(FLAGS_deltas));
  for (int k = 1; k <= n; ++k) {
    std::vector<uint64_t> some(changed);
    for (uint64_t& id : some) id = ids[rng() % ids.size()];
    std::sort(some.begin(), some.end());
    some.erase(std::unique(some.begin(), some.end()), some.end());
    Push(store.get(), some, dim, 1 + k);
    const Written d = Write(store.get(), dir, &chain, &since);
    chain.sequence = k + 1;
    chain.previous_crc = d.crc;
    delta_bytes += d.info.bytes();
    delta_write_ms += d.info.duration_ms();
    deltas.push_back(d.info.path());
  }
  delta_bytes /= n;
  delta_write_ms /= n;

  std::vector<double> full_ms, chain_ms;
  for (int r = 0; r < std::max(1, absl::GetFlag(FLAGS_reps)); ++r) {
    full_ms.push_back(RestoreMs(full.info.path(), {}, rows));
    chain_ms.push_back(RestoreMs(full.info.path(), deltas, rows));
  }
  const double f = Median(full_ms), c = Median(chain_ms);
  std::printf(
      "rows=%lld dim=%d changed=%.3f deltas=%d full_bytes=%llu "
      "delta_bytes=%.0f delta_ratio=%.4f full_write_ms=%.1f "
      "delta_write_ms=%.1f full_restore_ms=%.1f chain_restore_ms=%.1f "
      "restore_ratio=%.3f\n",
      static_cast<long long>(rows), dim, absl::GetFlag(FLAGS_changed), n,
      static_cast<unsigned long long>(full.info.bytes()), delta_bytes,
      delta_bytes / full.info.bytes(), full.info.duration_ms(), delta_write_ms,
      f, c, c / f);
  std::fflush(stdout);
  store.reset();
  StampCost(rows, dim);
  return 0;
}

}  // namespace
}  // namespace asyncps

int main(int argc, char** argv) { return asyncps::Main(argc, argv); }
