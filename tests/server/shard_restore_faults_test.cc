// A restarting shard (PsServer::Start with a --checkpoint_dir) reads its
// checkpoint directory through PsServerOptions::fs: a listing that fails, a
// checkpoint or spec file that reads back truncated, fails its reads or
// vanishes after the listing each fail the start with an error naming the
// file or directory (the shard never serves a half-restored store), write
// nothing, and leave the files as they were: a start without the fault
// restores exactly the state they hold. A full disk does not keep a shard
// from restoring and serving.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/payload.h"
#include "server/checkpoint.h"
#include "server/file_system.h"
#include "server/ps_server.h"
#include "server/spec_file.h"
#include "store/shard_store.h"
#include "tests/testing/fault_file_system.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/store_helpers.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/tensor_specs.h"

namespace asyncps {
namespace {

using Fault = testing::FaultFileSystem::Fault;

constexpr char kRun[] = "run-s";
constexpr int kSlices = 6;  // of "w"

absl::StatusCode CodeOf(int err) { return absl::ErrnoToStatus(err, "").code(); }

bool Names(const absl::Status& s, const std::string& path) {
  return absl::StrContains(s.message(), path);
}

// Shard 0 of 1's files in `dir`: a checkpoint of "w" (kSlices slices, each
// pushed once) and a spec file that also holds "late", created after it.
void WriteFiles(const std::string& dir) {
  ShardStoreOptions o;
  o.shard_index = 0;
  o.num_shards = 1;
  std::unique_ptr<ShardStore> store = ShardStore::Create(o).value();
  CreateTensorRequest create;
  *create.add_tensors() = testing::ConstantSpec("w", {4 * kSlices}, 1.0f,
                                                testing::SgdSpec(1.0f), 4);
  REQUIRE_OK(store->CreateTensors(create).status());
  PushRequest push;
  for (int slice = 0; slice < kSlices; ++slice) {
    SliceGradient* g = push.add_grads();
    g->set_tensor("w");
    g->set_slice(slice);
    const std::vector<float> grad(4, 0.5f);
    EncodeFloats(grad.data(), grad.size(), g->mutable_grad());
  }
  PushResponse resp;
  REQUIRE_OK(testing::ApplyPush(store.get(), push, StalenessRule{}, &resp));
  REQUIRE_OK(
      WriteCheckpoint(CaptureCheckpoint(*store, {}, absl::Now(), "", kRun), dir)
          .status());
  SpecFileContents specs;
  specs.identity.set_shard_index(0);
  specs.identity.set_num_shards(1);
  specs.identity.set_run_id(kRun);
  specs.tensors = store->ListTensors();
  specs.tensors.push_back(
      testing::ConstantSpec("late", {8}, 2.0f, testing::SgdSpec(1.0f), 4));
  REQUIRE_OK(WriteSpecFile(SpecFilePath(dir, 0, 1), specs));
}

absl::StatusOr<std::unique_ptr<PsServer>> StartShard(const std::string& dir,
                                                     FileSystem* fs) {
  PsServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.store.shard_index = 0;
  o.store.num_shards = 1;
  o.checkpoint_dir = dir;
  o.run_id = kRun;
  o.fs = fs;
  o.logger = NullLogger();
  return PsServer::Start(std::move(o));
}

// What a shard that restored `dir` completely holds.
void RequireRestored(PsServer* server, const std::string& dir) {
  const StatusResponse status = server->GetStatus();
  CHECK(status.tensors() == 2);  // "w" from the checkpoint, "late" created
  CHECK(status.restored_from().path() == CheckpointPath(dir, 0, 1));
  CHECK(status.restored_from().slices() == kSlices);
  CHECK(status.restored_from().slice_updates() == kSlices);
}

// The inodes of the shard's files: a rewrite (rename over) changes them.
std::pair<uint64_t, uint64_t> Inodes(const std::string& dir) {
  FileSystem* fs = FileSystem::Default();
  absl::StatusOr<FileStat> ckpt = fs->Stat(CheckpointPath(dir, 0, 1));
  absl::StatusOr<FileStat> specs = fs->Stat(SpecFilePath(dir, 0, 1));
  REQUIRE_OK(ckpt.status());
  REQUIRE_OK(specs.status());
  return {ckpt->inode, specs->inode};
}

bool IsRead(const std::string& op) {
  return absl::StartsWith(op, "open ") || absl::StartsWith(op, "read ") ||
         absl::StartsWith(op, "list ") || absl::StartsWith(op, "stat ");
}

TEST_CASE(
    "a shard whose checkpoint directory cannot be listed or read does not "
    "start, naming the file, and writes nothing",
    "[restore][faults][server]") {
  const std::string dir = testing::MakeTmpDir("shard_read_faults");
  WriteFiles(dir);
  const std::string ckpt = CheckpointPath(dir, 0, 1);
  const std::string specs = SpecFilePath(dir, 0, 1);
  const std::pair<uint64_t, uint64_t> inodes = Inodes(dir);
  testing::FaultFileSystem fs;
  absl::Status s;

  SECTION("the directory cannot be listed") {
    fs.FailListing(dir, EACCES);
    s = StartShard(dir, &fs).status();
    INFO(s.ToString());
    CHECK(absl::IsPermissionDenied(s));
    CHECK(Names(s, dir));
  }
  SECTION("the checkpoint reads back truncated") {
    absl::StatusOr<FileStat> st = FileSystem::Default()->Stat(ckpt);
    REQUIRE_OK(st.status());
    fs.TruncateReads(ckpt, st->size - 4);  // all but the checksum
    s = StartShard(dir, &fs).status();
    INFO(s.ToString());
    CHECK(absl::IsDataLoss(s));
    CHECK(Names(s, ckpt));
  }
  SECTION("the checkpoint's reads fail") {
    fs.FailReads(ckpt);
    s = StartShard(dir, &fs).status();
    INFO(s.ToString());
    CHECK(s.code() == CodeOf(EIO));
    CHECK(Names(s, ckpt));
  }
  SECTION("the checkpoint vanishes between the listing and its open") {
    fs.VanishAfterListing(ckpt);
    s = StartShard(dir, &fs).status();
    INFO(s.ToString());
    CHECK(absl::IsNotFound(s));
    CHECK(Names(s, ckpt));
  }
  SECTION("the spec file's reads fail") {
    fs.FailReads(specs);
    s = StartShard(dir, &fs).status();
    INFO(s.ToString());
    CHECK(s.code() == CodeOf(EIO));
    CHECK(Names(s, specs));
  }
  SECTION("the spec file reads back truncated") {
    absl::StatusOr<FileStat> st = FileSystem::Default()->Stat(specs);
    REQUIRE_OK(st.status());
    fs.TruncateReads(specs, st->size / 2);
    s = StartShard(dir, &fs).status();
    INFO(s.ToString());
    CHECK(absl::IsDataLoss(s));
    CHECK(Names(s, specs));
  }
  REQUIRE(!s.ok());
  CHECK(Inodes(dir) == inodes);  // nothing rewritten

  // The files are as they were: without the fault the shard restores them.
  fs.ClearPathFaults();
  absl::StatusOr<std::unique_ptr<PsServer>> server = StartShard(dir, &fs);
  REQUIRE_OK(server.status());
  RequireRestored(server->get(), dir);
  REQUIRE_OK((*server)->Shutdown(absl::ZeroDuration()));
}

TEST_CASE(
    "a shard's start that fails at any read step of its restore ends in "
    "an error naming the file",
    "[restore][faults][server]") {
  const std::string dir = testing::MakeTmpDir("shard_read_sweep");
  WriteFiles(dir);

  // The operations of one clean start: the directory check and the restore
  // read; then the spec file and checkpoints are written.
  testing::FaultFileSystem counter;
  {
    absl::StatusOr<std::unique_ptr<PsServer>> server =
        StartShard(dir, &counter);
    REQUIRE_OK(server.status());
    RequireRestored(server->get(), dir);
  }
  const std::vector<std::string> ops = counter.log();
  // Its shutdown wrote a final checkpoint (holding "late" too): the files
  // again as the sweep's starts are to read them, step for step.
  WriteFiles(dir);
  size_t reads = 0;
  while (reads < ops.size() && IsRead(ops[reads])) ++reads;
  REQUIRE(reads >= 20);
  REQUIRE(reads < ops.size());  // writes follow (spec file, checkpoints)
  const std::string ckpt = CheckpointPath(dir, 0, 1);
  const std::string specs = SpecFilePath(dir, 0, 1);
  CHECK(ops[0] == "list " + dir);
  // The checkpoint is opened three times: for its identity (the directory
  // check), for the map it was written under, then for the restore; the
  // spec file twice (its map is the checkpoint's).
  auto count = [&](const std::string& op) {
    return std::count(ops.begin(), ops.begin() + reads, op);
  };
  CHECK(count("open " + ckpt) == 3);
  CHECK(count("open " + specs) == 2);
  CHECK(count("stat " + ckpt) == 1);

  int failed = 0;
  std::pair<uint64_t, uint64_t> inodes = Inodes(dir);
  for (Fault fault : {Fault::kFailOp, Fault::kShortRead}) {
    for (size_t at = 0; at < reads; ++at) {
      testing::FaultFileSystem fs;
      fs.Arm(static_cast<int>(at), fault);
      absl::StatusOr<std::unique_ptr<PsServer>> server = StartShard(dir, &fs);
      INFO("fault " << static_cast<int>(fault) << " at " << ops[at] << ": "
                    << server.status());
      if (ops[at] == "stat " + ckpt) {
        // Only the size in a log line: the restore goes on.
        REQUIRE_OK(server.status());
        RequireRestored(server->get(), dir);
        REQUIRE_OK((*server)->Shutdown(absl::ZeroDuration()));
        WriteFiles(dir);  // as above
        inodes = Inodes(dir);
        continue;
      }
      const absl::Status s = server.status();
      REQUIRE(!s.ok());
      ++failed;
      CHECK(Names(s, ops[at].substr(ops[at].find(' ') + 1)));
      if (fault == Fault::kShortRead && absl::StartsWith(ops[at], "read ")) {
        CHECK(absl::IsDataLoss(s));
      } else {
        CHECK(s.code() == CodeOf(EIO));
      }
      CHECK(Inodes(dir) == inodes);
    }
  }
  CHECK(failed == static_cast<int>(2 * (reads - 1)));

  absl::StatusOr<std::unique_ptr<PsServer>> server =
      StartShard(dir, FileSystem::Default());
  REQUIRE_OK(server.status());
  RequireRestored(server->get(), dir);
}

TEST_CASE(
    "a shard restarted on a full disk restores its files and serves, "
    "rewriting none of them",
    "[restore][faults][server]") {
  const std::string dir = testing::MakeTmpDir("shard_full_disk");
  WriteFiles(dir);
  SECTION("its spec file holds what it restores (the shard wrote it)") {
    absl::StatusOr<std::unique_ptr<PsServer>> server =
        StartShard(dir, FileSystem::Default());
    REQUIRE_OK(server.status());
    RequireRestored(server->get(), dir);
    REQUIRE_OK((*server)->Shutdown(absl::ZeroDuration()));
  }
  SECTION("its spec file is to be written anew (another identity)") {}
  const std::pair<uint64_t, uint64_t> inodes = Inodes(dir);
  testing::FaultFileSystem fs;
  fs.FillDisk();
  absl::StatusOr<std::unique_ptr<PsServer>> server = StartShard(dir, &fs);
  REQUIRE_OK(server.status());
  CHECK((*server)->GetStatus().tensors() == 2);
  // Its final checkpoint cannot be written; the files stay as they were.
  const absl::Status stopped = (*server)->Shutdown(absl::ZeroDuration());
  INFO(stopped.ToString());
  CHECK(absl::IsResourceExhausted(stopped));
  CHECK(Inodes(dir) == inodes);
  fs.ClearPathFaults();
  server = StartShard(dir, &fs);
  REQUIRE_OK(server.status());
  CHECK((*server)->GetStatus().tensors() == 2);
}

}  // namespace
}  // namespace asyncps
