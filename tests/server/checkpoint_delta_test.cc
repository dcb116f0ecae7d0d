// Incremental checkpoints (server/checkpoint_delta.h) on real files: a full
// checkpoint and its deltas restore the live store bit for bit (values,
// versions, optimizer state, last-use clocks, worker records; evicted rows
// stay gone); a torn, corrupt or missing delta is ignored with every delta
// after it; a full checkpoint every K and past the size fraction, the old
// chain pruned; reads of deltas under injected faults; a reshard reads the
// deltas.
#include "server/checkpoint_delta.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/payload.h"
#include "server/checkpoint.h"
#include "server/checkpoint_dir.h"
#include "server/checkpointer.h"
#include "server/reshard.h"
#include "server/shard_set.h"
#include "spdlog/sinks/ostream_sink.h"
#include "store/shard_store.h"
#include "tests/testing/fault_file_system.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/store_helpers.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/table_helpers.h"

namespace asyncps {
namespace {

using testing::CreateTable;
using testing::IdsOn;
using testing::MakeTableSpec;
using testing::PushRows;

std::unique_ptr<ShardStore> Store(int shard, int shards, bool track = false) {
  ShardStoreOptions o;
  o.shard_index = shard;
  o.num_shards = shards;
  o.default_slice_elems = 16;
  o.row_ttl_steps = 8;
  o.track_removed_rows = track;
  return ShardStore::Create(o).value();
}

// Everything a checkpoint holds of a store, by name, bit for bit.
using Dump = std::map<std::string, std::string>;

std::string Bytes(const float* p, size_t n) {
  return std::string(reinterpret_cast<const char*>(p), n * sizeof(float));
}

Dump DumpOf(const ShardStore& store) {
  Dump out;
  std::string tensor;
  REQUIRE_OK(store.Export(
      [&](const TensorSpec& spec) {
        tensor = spec.name();
        out["spec " + tensor] = spec.SerializeAsString();
        return absl::OkStatus();
      },
      [&](const ShardStore::SliceView& v) {
        std::string& d = out[absl::StrCat("slice ", tensor, "/", v.index)];
        d = absl::StrCat(v.version, ":",
                         Bytes(v.values.data(), v.values.size()));
        for (const auto& s : v.optimizer_state) d += Bytes(s.data(), s.size());
        return absl::OkStatus();
      }));
  std::string table;
  REQUIRE_OK(store.tables().Export(
      [&](const TableSpec& spec) {
        table = spec.name();
        out["table " + table] = spec.SerializeAsString();
        return absl::OkStatus();
      },
      [&](const SparseTable::RowView& r) {
        out[absl::StrCat("row ", table, "/", r.id)] =
            absl::StrCat(r.version, ":", r.touched, ":", Bytes(r.values, r.dim),
                         Bytes(r.state, r.state_floats));
        return absl::OkStatus();
      }));
  out["reserved"] = absl::StrCat(store.Size().reserved_bytes);
  return out;
}

std::vector<std::string> Names(const std::vector<CheckpointWorker>& workers) {
  std::vector<std::string> out;
  for (const CheckpointWorker& w : workers)
    out.push_back(w.SerializeAsString());
  return out;
}

// A shard's store with a Checkpointer writing to `dir` as ps_server's does
// (the capture advances the change epoch first), and a worker record whose
// clock moves with the steps.
struct Shard {
  Shard(const std::string& dir, int full_every, double fraction, int index = 0,
        int shards = 1, FileSystem* fs = FileSystem::Default(),
        std::shared_ptr<spdlog::logger> logger = NullLogger())
      : store(Store(index, shards, /*track=*/true)) {
    CheckpointerOptions o;
    o.dir = dir;
    o.full_every = full_every;
    o.delta_max_fraction = fraction;
    o.fs = fs;
    o.logger = std::move(logger);
    o.capture = [this] { return Capture(nullptr, 0); };
    o.capture_delta = [this](uint32_t since, const DeltaChain& chain) {
      return Capture(&chain, since);
    };
    checkpointer = Checkpointer::Start(std::move(o)).value();
    CheckpointWorker w;
    w.set_worker_id(0);
    w.set_incarnation(7);
    workers.push_back(w);
  }

  CheckpointImage Capture(const DeltaChain* chain, uint32_t since) {
    if (chain != nullptr) store->tables().ForgetRemovedBefore(since);
    const uint32_t epoch = store->AdvanceChangeEpoch();
    CheckpointImage image =
        chain == nullptr
            ? CaptureCheckpoint(*store, workers, absl::Now(), "", "run")
            : CaptureDelta(*store, workers, absl::Now(), since, *chain, "",
                           "run");
    image.epoch = epoch;
    return image;
  }

  CheckpointInfo Write() {
    absl::StatusOr<CheckpointInfo> info = checkpointer->WriteNow();
    REQUIRE_OK(info.status());
    return *info;
  }

  std::unique_ptr<ShardStore> store;
  std::vector<CheckpointWorker> workers;
  std::unique_ptr<Checkpointer> checkpointer;
};

// Creates dense "w" (Adam, 5 slices on one shard) and tables "a" (Adam,
// dim 8) and "b" (Adagrad, dim 3).
void CreateModel(ShardStore* store) {
  CreateTensorRequest dense;
  TensorSpec* t = dense.add_tensors();
  t->set_name("w");
  t->add_shape(80);
  t->set_init(INIT_UNIFORM);
  t->set_init_value(0.1f);
  *t->mutable_optimizer() = testing::AdamSpec();
  REQUIRE_OK(store->CreateTensors(dense).status());
  REQUIRE_OK(CreateTable(store, MakeTableSpec("a", 8, testing::AdamSpec())));
  REQUIRE_OK(CreateTable(store, MakeTableSpec("b", 3, testing::AdagradSpec())));
}

// One training interval at worker clock `clock`: pushes to `ids` of "a",
// to a few rows of "b" and to dense slice `clock % 5`.
void Step(ShardStore* store, const std::vector<uint64_t>& ids, int64_t clock) {
  std::vector<float> g(ids.size() * 8);
  for (size_t i = 0; i < g.size(); ++i) g[i] = 0.01f * (i % 13) - 0.05f * clock;
  REQUIRE_OK(PushRows(store, "a", ids, g, {}, {}, clock).status());
  const std::vector<uint64_t> b = {ids[0], ids[0] + 1000003};
  REQUIRE_OK(PushRows(store, "b", b, std::vector<float>(6, 0.5f * clock), {},
                      {}, clock)
                 .status());
  PushRequest req;
  SliceGradient* s = req.add_grads();
  s->set_tensor("w");
  s->set_slice(static_cast<uint32_t>(clock % 5));
  s->set_read_version(0);
  const std::vector<float> grad(16, 0.125f * clock);
  EncodeFloats(grad.data(), grad.size(), s->mutable_grad());
  PushResponse resp;
  REQUIRE_OK(testing::ApplyPush(store, req, StalenessRule{}, &resp));
}

// Creates the model, writes a full checkpoint after one step over `rows`
// rows, then `deltas` deltas, each after a step over one of those rows and
// a new one; returns the store's state at each file (0: the full one).
std::vector<Dump> WriteChain(Shard* shard, size_t rows, int deltas) {
  CreateModel(shard->store.get());
  const std::vector<uint64_t> ids = IdsOn("a", 0, 1, rows);
  Step(shard->store.get(), ids, 1);
  shard->Write();
  std::vector<Dump> states = {DumpOf(*shard->store)};
  for (int64_t clock = 2; clock <= deltas + 1; ++clock) {
    Step(shard->store.get(), {ids[clock], 9000 + static_cast<uint64_t>(clock)},
         clock);
    shard->Write();
    states.push_back(DumpOf(*shard->store));
  }
  return states;
}

absl::StatusOr<RestoredCheckpoint> RestoreChain(const std::string& dir,
                                                ShardStore* into,
                                                FileSystem* fs = nullptr) {
  RestoreCheckpointOptions o;
  o.fs = fs;
  o.deltas = ListDeltaFiles(dir, into->options().shard_index,
                            into->options().num_shards, fs)
                 .value();
  return RestoreCheckpoint(CheckpointPath(dir, into->options().shard_index,
                                          into->options().num_shards),
                           into, o);
}

void Corrupt(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(0, std::ios::end);
  const std::streamoff size = f.tellg();
  f.seekp(size / 2);
  char c = 0;
  f.seekg(size / 2);
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(size / 2);
  f.write(&c, 1);
}

TEST_CASE("a full checkpoint and ten deltas restore the live store bit for bit",
          "[checkpoint][delta]") {
  const std::string dir = testing::MakeTmpDir("delta_exact");
  Shard shard(dir, /*full_every=*/100, /*fraction=*/100);
  CreateModel(shard.store.get());
  const std::vector<uint64_t> ids = IdsOn("a", 0, 1, 3000);
  Step(shard.store.get(), ids, 1);
  CheckpointInfo full = shard.Write();
  REQUIRE_FALSE(full.delta());

  std::vector<uint64_t> evicted;
  for (int64_t clock = 2; clock <= 11; ++clock) {
    // A few rows of the old ones again, and new ones.
    std::vector<uint64_t> some(ids.begin() + clock * 20,
                               ids.begin() + clock * 20 + 30);
    some.push_back(5000000 + clock);
    Step(shard.store.get(), some, clock * 10);
    if (clock == 4) {
      // Rows unused for 8 steps go: most of the first 3000.
      REQUIRE(shard.store->tables().EvictIdle(clock * 10) > 2000);
    }
    shard.workers[0].set_clock(clock);
    shard.workers[0].set_dedup_base(clock * 3);
    const CheckpointInfo info = shard.Write();
    REQUIRE(info.delta());
    REQUIRE(info.delta_sequence() == static_cast<uint64_t>(clock - 1));
    if (clock == 4) CHECK(info.removed_rows() > 2000);
    CHECK(info.bytes() < full.bytes() / 4);
  }
  for (uint64_t id : ids) {
    float v[8];
    uint64_t version = 0;
    if (!shard.store->tables().Find("a")->Peek(id, v, &version)) {
      evicted.push_back(id);
    }
  }
  REQUIRE(evicted.size() > 2000);
  REQUIRE(ListDeltaFiles(dir, 0, 1).value().size() == 10);

  std::unique_ptr<ShardStore> restored = Store(0, 1);
  absl::StatusOr<RestoredCheckpoint> r = RestoreChain(dir, restored.get());
  REQUIRE_OK(r.status());
  CHECK(r->info.deltas_applied() == 10);
  CHECK(r->info.deltas_ignored() == 0);
  CHECK(r->info.rows() == shard.store->tables().totals().rows);
  CHECK(Names(r->workers) == Names(shard.workers));
  const Dump live = DumpOf(*shard.store);
  const Dump back = DumpOf(*restored);
  CHECK(back.size() == live.size());
  CHECK(back == live);
  // Evicted rows are not resurrected.
  for (uint64_t id : evicted) {
    float v[8];
    uint64_t version = 0;
    REQUIRE_FALSE(restored->tables().Find("a")->Peek(id, v, &version));
  }
}

TEST_CASE("rows a delta replaces need no more memory than the live store's",
          "[checkpoint][delta]") {
  const std::string dir = testing::MakeTmpDir("delta_cap");
  Shard shard(dir, 100, 100);
  const std::vector<Dump> states = WriteChain(&shard, 2000, 3);
  // The restore's store capped at exactly what the live one holds: the
  // deltas' rows of existing ids must not be counted twice.
  ShardStoreOptions o;
  o.default_slice_elems = 16;
  o.row_ttl_steps = 8;
  o.max_parameter_bytes = shard.store->Size().reserved_bytes;
  std::unique_ptr<ShardStore> capped = ShardStore::Create(o).value();
  absl::StatusOr<RestoredCheckpoint> r = RestoreChain(dir, capped.get());
  REQUIRE_OK(r.status());
  CHECK(r->info.deltas_applied() == 3);
  CHECK(DumpOf(*capped) == states.back());
}

TEST_CASE("a torn, corrupt or missing delta is ignored with every later one",
          "[checkpoint][delta]") {
  const std::string dir = testing::MakeTmpDir("delta_torn");
  Shard shard(dir, 100, 100);
  const std::vector<Dump> states = WriteChain(&shard, 200, 3);
  const std::string d1 = DeltaPath(dir, 0, 1, 1);
  const std::string d2 = DeltaPath(dir, 0, 1, 2);
  std::string d2_bytes;
  {
    std::ifstream in(d2, std::ios::binary);
    d2_bytes.assign(std::istreambuf_iterator<char>(in),
                    std::istreambuf_iterator<char>());
  }
  REQUIRE(d2_bytes.size() > 100);

  auto check = [&](const std::string& what, int applied, int ignored,
                   const std::string& reason) {
    INFO(what);
    std::unique_ptr<ShardStore> restored = Store(0, 1);
    absl::StatusOr<RestoredCheckpoint> r = RestoreChain(dir, restored.get());
    REQUIRE_OK(r.status());
    INFO(r->deltas_ignored_reason);
    CHECK(r->info.deltas_applied() == applied);
    CHECK(r->info.deltas_ignored() == ignored);
    CHECK(absl::StrContains(r->deltas_ignored_reason, reason));
    CHECK(DumpOf(*restored) == states[applied]);
  };
  check("intact", 3, 0, "");

  // A flipped byte: the checksum does not match.
  Corrupt(d2);
  check("corrupt", 1, 2, d2);
  // Torn: the first half of the file.
  std::ofstream(d2, std::ios::binary | std::ios::trunc)
      << d2_bytes.substr(0, d2_bytes.size() / 2);
  check("torn", 1, 2, d2);
  // Missing: delta 3 does not follow delta 1.
  std::remove(d2.c_str());
  check("missing", 1, 1, "delta 2 is missing");
  // Put back, the chain is whole again.
  std::ofstream(d2, std::ios::binary | std::ios::trunc) << d2_bytes;
  check("put back", 3, 0, "");

  // A delta of another chain (an older full checkpoint's) is not applied.
  shard.checkpointer.reset();
  Shard other(dir, 100, 100);  // a restarted shard writes a full one first
  CreateModel(other.store.get());
  const std::string keep = d1 + ".old";
  REQUIRE(::link(d1.c_str(), keep.c_str()) == 0);
  other.Write();
  CHECK(ListDeltaFiles(dir, 0, 1).value().empty());  // pruned
  REQUIRE(std::rename(keep.c_str(), d1.c_str()) == 0);
  std::unique_ptr<ShardStore> restored = Store(0, 1);
  absl::StatusOr<RestoredCheckpoint> r = RestoreChain(dir, restored.get());
  REQUIRE_OK(r.status());
  CHECK(r->info.deltas_applied() == 0);
  CHECK(r->info.deltas_ignored() == 1);
  CHECK(absl::StrContains(r->deltas_ignored_reason,
                          "follows another full checkpoint"));
  CHECK(DumpOf(*restored) == DumpOf(*other.store));
}

TEST_CASE("a full checkpoint every K, or once the deltas grow; old deltas go",
          "[checkpoint][delta]") {
  const std::string dir = testing::MakeTmpDir("delta_every");
  Shard shard(dir, /*full_every=*/3, /*fraction=*/100);
  CreateModel(shard.store.get());
  const std::vector<uint64_t> ids = IdsOn("a", 0, 1, 500);
  std::string kinds;
  for (int64_t clock = 1; clock <= 7; ++clock) {
    Step(shard.store.get(), {ids[clock]}, clock);
    const CheckpointInfo info = shard.Write();
    kinds += info.delta() ? "d" : "F";
    const size_t deltas = ListDeltaFiles(dir, 0, 1).value().size();
    CHECK(deltas == (info.delta() ? info.delta_sequence() : 0));
  }
  CHECK(kinds == "FddFddF");

  // 0 and 1: always full, as before incremental checkpoints.
  for (int k : {0, 1}) {
    const std::string d = testing::MakeTmpDir("delta_never");
    Shard always(d, k, 0.5);
    CreateModel(always.store.get());
    for (int i = 0; i < 3; ++i) CHECK_FALSE(always.Write().delta());
    CHECK(ListDeltaFiles(d, 0, 1).value().empty());
  }

  // Deltas that together reach the fraction of the full size: a full one.
  const std::string big = testing::MakeTmpDir("delta_fraction");
  Shard growing(big, 100, 0.15);
  CreateModel(growing.store.get());
  Step(growing.store.get(), ids, 1);
  const CheckpointInfo full = growing.Write();
  kinds.clear();
  for (int64_t clock = 2; clock <= 6; ++clock) {
    // A tenth of the rows each time.
    Step(growing.store.get(),
         std::vector<uint64_t>(ids.begin(), ids.begin() + 50), clock);
    const CheckpointInfo info = growing.Write();
    kinds += info.delta() ? "d" : "F";
    if (info.delta()) CHECK(info.bytes() < full.bytes() / 5);
  }
  CHECK(kinds.substr(0, 3) == "ddF");
}

TEST_CASE(
    "reads of deltas under faults fail naming the file or ignore a torn one",
    "[checkpoint][delta][faults]") {
  const std::string dir = testing::MakeTmpDir("delta_faults");
  Shard shard(dir, 100, 100);
  const std::vector<Dump> states = WriteChain(&shard, 100, 2);

  // The operations of one clean restore through the shard set.
  testing::FaultFileSystem counter;
  absl::StatusOr<ShardFileSet> set = FindShardFileSet(dir, &counter);
  REQUIRE_OK(set.status());
  REQUIRE(set->deltas[0].size() == 2);
  REQUIRE_OK(RestoreShard(*set, 0, &counter).status());
  const std::vector<std::string> ops = counter.log();
  int on_deltas = 0;
  using Fault = testing::FaultFileSystem::Fault;
  for (Fault fault : {Fault::kFailOp, Fault::kShortRead}) {
    for (size_t at = 0; at < ops.size(); ++at) {
      testing::FaultFileSystem fs;
      fs.Arm(static_cast<int>(at), fault);
      absl::StatusOr<ShardFileSet> found = FindShardFileSet(dir, &fs);
      absl::StatusOr<RestoredShard> r =
          found.ok() ? RestoreShard(*found, 0, &fs)
                     : absl::StatusOr<RestoredShard>(found.status());
      INFO("fault " << static_cast<int>(fault) << " at " << ops[at] << ": "
                    << r.status());
      const bool delta = absl::StrContains(ops[at], ".delta-");
      on_deltas += delta;
      if (fault == Fault::kShortRead && delta &&
          absl::StartsWith(ops[at], "read ")) {
        // A delta that reads back short is torn: it and the later ones are
        // ignored, the earlier state restored.
        REQUIRE_OK(r.status());
        const int k = absl::StrContains(ops[at], ".delta-1") ? 0 : 1;
        CHECK(DumpOf(*r->store) == states[k]);
        continue;
      }
      // Otherwise an error naming the file: no half-restored store.
      REQUIRE_FALSE(r.ok());
      const std::string path = ops[at].substr(ops[at].find(' ') + 1);
      CHECK(absl::StrContains(r.status().message(), path));
    }
  }
  CHECK(on_deltas >= 8);

  // A delta that vanished after the listing: NOT_FOUND naming it.
  testing::FaultFileSystem fs;
  fs.VanishAfterListing(DeltaPath(dir, 0, 1, 2));
  absl::StatusOr<ShardFileSet> found = FindShardFileSet(dir, &fs);
  REQUIRE_OK(found.status());
  absl::StatusOr<RestoredShard> r = RestoreShard(*found, 0, &fs);
  CHECK(absl::IsNotFound(r.status()));
  CHECK(absl::StrContains(r.status().message(), DeltaPath(dir, 0, 1, 2)));
}

// Adds the rows of table "a" of `store` to *rows: id -> values, version.
void AddRowsOfA(const ShardStore& store,
                std::map<uint64_t, std::vector<float>>* rows) {
  std::string table;
  REQUIRE_OK(store.tables().Export(
      [&](const TableSpec& spec) {
        table = spec.name();
        return absl::OkStatus();
      },
      [&](const SparseTable::RowView& r) {
        if (table != "a") return absl::OkStatus();
        std::vector<float>& v = (*rows)[r.id];
        v.assign(r.values, r.values + r.dim);
        v.push_back(static_cast<float>(r.version));
        return absl::OkStatus();
      }));
}

TEST_CASE(
    "a checkpoint failure that lasts is logged once a minute, not at "
    "every write",
    "[checkpoint][faults]") {
  const std::string dir = testing::MakeTmpDir("full_disk");
  std::ostringstream lines;
  testing::FaultFileSystem fs;
  Shard shard(
      dir, 1, 0.5, 0, 1, &fs,
      std::make_shared<spdlog::logger>(
          "shard", std::make_shared<spdlog::sinks::ostream_sink_mt>(lines)));
  CreateModel(shard.store.get());
  const auto failures = [&lines] {
    const std::string text = lines.str();
    int n = 0;
    for (size_t at = text.find("checkpoint failed"); at != std::string::npos;
         at = text.find("checkpoint failed", at + 1)) {
      ++n;
    }
    return n;
  };
  fs.FillDisk();
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<CheckpointInfo> info = shard.checkpointer->WriteNow();
    CHECK(absl::IsResourceExhausted(info.status()));
  }
  CHECK(failures() == 1);
  CHECK(absl::StrContains(lines.str(), "No space left on device"));
  CHECK(shard.checkpointer->failed() == 5);
  CHECK(absl::StrContains(shard.checkpointer->last_error(),
                          "No space left on device"));  // Status says it
  // Written again: the next failure is news, logged at once.
  fs.ClearPathFaults();
  shard.Write();
  CHECK(shard.checkpointer->last_error().empty());
  fs.FillDisk();
  CHECK_FALSE(shard.checkpointer->WriteNow().ok());
  CHECK(failures() == 2);
}

TEST_CASE("a reshard reads each shard's full checkpoint and deltas",
          "[checkpoint][delta][reshard]") {
  const std::string dir = testing::MakeTmpDir("delta_reshard_from");
  std::vector<std::unique_ptr<Shard>> shards;
  for (int i = 0; i < 2; ++i) {
    shards.push_back(std::make_unique<Shard>(dir, 100, 100, i, 2));
    CreateModel(shards[i]->store.get());
  }
  std::map<uint64_t, std::vector<float>> expected;
  for (int64_t clock = 1; clock <= 4; ++clock) {
    for (int i = 0; i < 2; ++i) {
      const std::vector<uint64_t> ids =
          IdsOn("a", i, 2, 3, 100 * static_cast<uint64_t>(clock));
      std::vector<float> g(ids.size() * 8, 0.1f * clock);
      REQUIRE_OK(PushRows(shards[i]->store.get(), "a", ids, g, {}, {}, clock)
                     .status());
      shards[i]->Write();
    }
  }
  REQUIRE(ListDeltaFiles(dir, 1, 2).value().size() == 3);
  for (int i = 0; i < 2; ++i) AddRowsOfA(*shards[i]->store, &expected);
  REQUIRE(expected.size() == 24);

  const std::string to = testing::UniqueTmpPath("delta_reshard_to");
  ReshardOptions o;
  o.from_dir = dir;
  o.to_dir = to;
  o.num_shards = 3;
  REQUIRE_OK(Reshard(o).status());
  std::map<uint64_t, std::vector<float>> moved;
  absl::StatusOr<ShardFileSet> set = FindShardFileSet(to);
  REQUIRE_OK(set.status());
  for (int j = 0; j < 3; ++j) {
    absl::StatusOr<RestoredShard> r = RestoreShard(*set, j);
    REQUIRE_OK(r.status());
    AddRowsOfA(*r->store, &moved);
  }
  CHECK(moved == expected);
}

}  // namespace
}  // namespace asyncps
