// The read side of the file-system seam (server/file_system.h): restores,
// spec-file reads, directory listings and reshards read through a
// FileSystem, so that tests/testing/fault_file_system.h can make a file read
// back truncated, fail its reads (EIO), vanish between the directory listing
// and its open, or make a directory unlistable. Every such fault ends in an
// error that names the file or directory (never a crash, never an empty
// directory assumed), no half-restored store escapes, a reshard writes
// nothing, and once the fault is gone the files read back as they were.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/payload.h"
#include "server/checkpoint.h"
#include "server/checkpoint_dir.h"
#include "server/file_system.h"
#include "server/reshard.h"
#include "server/shard_set.h"
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

constexpr char kRun[] = "run-r";

// The status code an errno turns into (absl::ErrnoToStatus).
absl::StatusCode CodeOf(int err) { return absl::ErrnoToStatus(err, "").code(); }

bool Names(const absl::Status& s, const std::string& path) {
  return absl::StrContains(s.message(), path);
}

std::unique_ptr<ShardStore> Store(int shard, int shards) {
  ShardStoreOptions o;
  o.shard_index = shard;
  o.num_shards = shards;
  return ShardStore::Create(o).value();
}

// "w": 24 elements in slices of 4, every element `init`, SGD at rate 1.
TensorSpec W(float init) {
  return testing::ConstantSpec("w", {24}, init, testing::SgdSpec(1.0f), 4);
}

// Every local slice of "w" of `store`, pushed once with gradient `g`.
void PushAll(ShardStore* store, float g) {
  PullRequest pull;
  pull.add_tensors("w");
  PullResponse pulled;
  REQUIRE_OK(store->Pull(pull, &pulled));
  PushRequest req;
  for (const SliceData& d : pulled.slices()) {
    SliceGradient* grad = req.add_grads();
    grad->set_tensor("w");
    grad->set_slice(d.slice());
    grad->set_read_version(d.version());
    const std::vector<float> values(d.values().size() / sizeof(float), g);
    EncodeFloats(values.data(), values.size(), grad->mutable_grad());
  }
  PushResponse resp;
  REQUIRE_OK(testing::ApplyPush(store, req, StalenessRule{}, &resp));
}

// (slice, version, values) of every local slice of "w", in order.
std::vector<std::string> Slices(const ShardStore& store) {
  PullRequest pull;
  pull.add_tensors("w");
  PullResponse pulled;
  REQUIRE_OK(store.Pull(pull, &pulled));
  std::vector<std::string> out;
  for (const SliceData& d : pulled.slices()) {
    out.push_back(absl::StrCat(d.slice(), "@", d.version(), ":", d.values()));
  }
  return out;
}

// Writes shard `shard` of `shards`: a checkpoint of "w" trained once (with
// gradient shard + 1) and a spec file that also holds "late", created after
// the checkpoint. Returns the trained slices.
std::vector<std::string> WriteShard(const std::string& dir, int shard,
                                    int shards) {
  std::unique_ptr<ShardStore> store = Store(shard, shards);
  CreateTensorRequest create;
  *create.add_tensors() = W(1.0f);
  REQUIRE_OK(store->CreateTensors(create).status());
  PushAll(store.get(), static_cast<float>(shard + 1));
  REQUIRE_OK(
      WriteCheckpoint(CaptureCheckpoint(*store, {}, absl::Now(), "", kRun), dir)
          .status());
  SpecFileContents specs;
  specs.identity.set_shard_index(shard);
  specs.identity.set_num_shards(shards);
  specs.identity.set_run_id(kRun);
  specs.tensors = store->ListTensors();
  specs.tensors.push_back(
      testing::ConstantSpec("late", {8}, 2.0f, testing::SgdSpec(1.0f), 4));
  REQUIRE_OK(WriteSpecFile(SpecFilePath(dir, shard, shards), specs));
  return Slices(*store);
}

uint64_t SizeOf(const std::string& path) {
  absl::StatusOr<FileStat> st = FileSystem::Default()->Stat(path);
  REQUIRE_OK(st.status());
  return st->size;
}

// The path an operation of FaultFileSystem::log() works on.
std::string PathOf(const std::string& op) {
  return op.substr(op.find(' ') + 1);
}

bool IsRead(const std::string& op) {
  return absl::StartsWith(op, "open ") || absl::StartsWith(op, "read ") ||
         absl::StartsWith(op, "list ") || absl::StartsWith(op, "stat ");
}

TEST_CASE("the POSIX file system reads, lists and stats, naming the path",
          "[file_system]") {
  FileSystem* fs = FileSystem::Default();
  const std::string dir = testing::MakeTmpDir("posix_fs");
  const std::string path = dir + "/a";
  {
    absl::StatusOr<std::unique_ptr<WritableFile>> w = fs->NewWritableFile(path);
    REQUIRE_OK(w.status());
    REQUIRE_OK((*w)->Append("0123456789"));
    REQUIRE_OK((*w)->Close());
  }
  absl::StatusOr<std::unique_ptr<SequentialFile>> r =
      fs->NewSequentialFile(path);
  REQUIRE_OK(r.status());
  CHECK((*r)->size() == 10);
  char buffer[8];
  absl::StatusOr<size_t> n = (*r)->Read(buffer, 8);
  REQUIRE_OK(n.status());
  CHECK(std::string(buffer, *n) == "01234567");
  n = (*r)->Read(buffer, 8);  // fewer than asked: the end of the file
  REQUIRE_OK(n.status());
  CHECK(std::string(buffer, *n) == "89");
  n = (*r)->Read(buffer, 8);
  REQUIRE_OK(n.status());
  CHECK(*n == 0);

  absl::StatusOr<FileStat> before = fs->Stat(path);
  REQUIRE_OK(before.status());
  CHECK(before->size == 10);
  CHECK(before->modified_ns > 0);
  // Replaced by a rename (as record files are): a new inode.
  {
    absl::StatusOr<std::unique_ptr<WritableFile>> w =
        fs->NewWritableFile(path + ".tmp");
    REQUIRE_OK(w.status());
    REQUIRE_OK((*w)->Append("0123456789"));
    REQUIRE_OK((*w)->Close());
  }
  REQUIRE_OK(fs->Rename(path + ".tmp", path));
  absl::StatusOr<FileStat> after = fs->Stat(path);
  REQUIRE_OK(after.status());
  CHECK(after->size == 10);
  CHECK(after->inode != before->inode);
  CHECK((*r)->size() == 10);  // the open file is the old one

  REQUIRE_OK(fs->CreateDirs(dir + "/x/y"));
  REQUIRE_OK(fs->CreateDirs(dir + "/x/y"));  // exists: fine
  absl::StatusOr<std::vector<std::string>> children = fs->GetChildren(dir);
  REQUIRE_OK(children.status());
  std::sort(children->begin(), children->end());
  CHECK(*children == std::vector<std::string>{"a", "x"});

  const std::string none = dir + "/none";
  for (const absl::Status& s :
       {fs->NewSequentialFile(none).status(), fs->Stat(none).status(),
        fs->GetChildren(none).status()}) {
    INFO(s.ToString());
    CHECK(absl::IsNotFound(s));
    CHECK(Names(s, none));
    CHECK(absl::StrContains(s.message(), "No such file or directory"));
  }
  const absl::Status dir_open = fs->NewSequentialFile(dir).status();
  CHECK(!dir_open.ok());
  CHECK(Names(dir_open, dir));
  const absl::Status over_file = fs->CreateDirs(path + "/sub");
  CHECK(!over_file.ok());
  CHECK(Names(over_file, path));
}

TEST_CASE(
    "a checkpoint or spec file that reads back short, fails its reads or "
    "vanished fails its restore, naming it; nothing half-restored",
    "[restore][faults]") {
  const std::string dir = testing::MakeTmpDir("read_faults");
  const std::vector<std::string> trained = WriteShard(dir, 0, 1);
  const std::string ckpt = CheckpointPath(dir, 0, 1);
  const std::string specs = SpecFilePath(dir, 0, 1);
  testing::FaultFileSystem fs;
  auto restore = [&fs](const std::string& path, ShardStore* store) {
    RestoreCheckpointOptions o;
    o.fs = &fs;
    return RestoreCheckpoint(path, store, o).status();
  };

  SECTION("a checkpoint that reads back truncated: DATA_LOSS") {
    fs.TruncateReads(ckpt, SizeOf(ckpt) / 2);
    std::unique_ptr<ShardStore> store = Store(0, 1);
    const absl::Status s = restore(ckpt, store.get());
    INFO(s.ToString());
    CHECK(absl::IsDataLoss(s));
    CHECK(Names(s, ckpt));
    CHECK(absl::StrContains(s.message(), "ended at byte"));
    const absl::Status id = ReadCheckpointIdentity(ckpt, &fs).status();
    CHECK((id.ok() || absl::IsDataLoss(id)));  // the identity comes first
  }
  SECTION("a checkpoint whose reads fail: EIO") {
    fs.FailReads(ckpt);
    std::unique_ptr<ShardStore> store = Store(0, 1);
    const absl::Status s = restore(ckpt, store.get());
    INFO(s.ToString());
    CHECK(s.code() == CodeOf(EIO));
    CHECK(Names(s, ckpt));
    CHECK(absl::StrContains(s.message(), "Input/output error"));
    CHECK(store->Size().tensors == 0);  // failed at the header
  }
  SECTION("a checkpoint that vanished after the listing: NOT_FOUND") {
    fs.VanishAfterListing(ckpt);
    absl::StatusOr<std::vector<ShardFile>> listed = ListShardFiles(dir, &fs);
    REQUIRE_OK(listed.status());
    REQUIRE(listed->size() == 2);
    CHECK((*listed)[0].path == ckpt);
    std::unique_ptr<ShardStore> store = Store(0, 1);
    const absl::Status s = restore(ckpt, store.get());
    INFO(s.ToString());
    CHECK(absl::IsNotFound(s));
    CHECK(Names(s, ckpt));
    CHECK(store->Size().tensors == 0);
    // The next listing does not list it any more.
    listed = ListShardFiles(dir, &fs);
    REQUIRE_OK(listed.status());
    REQUIRE(listed->size() == 1);
    CHECK((*listed)[0].path == specs);
  }
  SECTION("a spec file that reads back truncated, fails or vanished") {
    fs.TruncateReads(specs, SizeOf(specs) - 3);
    absl::Status s = ReadSpecFile(specs, &fs).status();
    INFO(s.ToString());
    CHECK(absl::IsDataLoss(s));
    CHECK(Names(s, specs));
    fs.ClearPathFaults();
    fs.FailReads(specs);
    s = ReadSpecFile(specs, &fs).status();
    INFO(s.ToString());
    CHECK(s.code() == CodeOf(EIO));
    CHECK(Names(s, specs));
    fs.ClearPathFaults();
    fs.VanishAfterListing(specs);
    REQUIRE_OK(ListShardFiles(dir, &fs).status());
    s = ReadSpecFile(specs, &fs).status();
    INFO(s.ToString());
    CHECK(absl::IsNotFound(s));
    CHECK(Names(s, specs));
  }

  // Whatever the fault was, the files are intact: once it is gone they
  // restore to exactly what was trained, through the same file system.
  fs.ClearPathFaults();
  absl::StatusOr<ShardFileSet> set = FindShardFileSet(dir, &fs);
  REQUIRE_OK(set.status());
  absl::StatusOr<RestoredShard> restored = RestoreShard(*set, 0, &fs);
  REQUIRE_OK(restored.status());
  CHECK(Slices(*restored->store) == trained);
  CHECK(restored->store->Size().tensors == 2);  // "w" and "late"
  CHECK(restored->run_id == kRun);
}

TEST_CASE(
    "a shard's restore that fails at any read step ends in an error "
    "naming the file, and returns no store",
    "[restore][faults]") {
  const std::string dir = testing::MakeTmpDir("read_sweep");
  const std::vector<std::string> trained = WriteShard(dir, 0, 1);

  // The operations of one clean restore: a listing, then opens and reads.
  testing::FaultFileSystem counter;
  absl::StatusOr<ShardFileSet> set = FindShardFileSet(dir, &counter);
  REQUIRE_OK(set.status());
  REQUIRE_OK(RestoreShard(*set, 0, &counter).status());
  const std::vector<std::string> ops = counter.log();
  REQUIRE(ops.size() >= 8);
  CHECK(ops[0] == "list " + dir);
  CHECK(ops[1] == "open " + CheckpointPath(dir, 0, 1));
  int reads = 0;
  for (const std::string& op : ops) {
    REQUIRE(IsRead(op));  // a restore writes nothing
    reads += absl::StartsWith(op, "read ") ? 1 : 0;
  }
  REQUIRE(reads >= 6);  // header, records and trailer of both files

  int cases = 0;
  for (Fault fault : {Fault::kFailOp, Fault::kShortRead}) {
    for (size_t at = 0; at < ops.size(); ++at) {
      testing::FaultFileSystem fs;
      fs.Arm(static_cast<int>(at), fault);
      absl::StatusOr<ShardFileSet> found = FindShardFileSet(dir, &fs);
      absl::Status s = found.status();
      if (found.ok()) s = RestoreShard(*found, 0, &fs).status();
      INFO("fault " << static_cast<int>(fault) << " at " << ops[at] << ": "
                    << s);
      // An error, so no store at all (not a partial one).
      REQUIRE(!s.ok());
      CHECK(Names(s, PathOf(ops[at])));
      if (fault == Fault::kShortRead && absl::StartsWith(ops[at], "read ")) {
        CHECK(absl::IsDataLoss(s));
      } else {
        CHECK(s.code() == CodeOf(EIO));
      }
      ++cases;
    }
  }
  CHECK(cases == static_cast<int>(2 * ops.size()));

  // The files were only read: a clean restore still gives the trained state.
  absl::StatusOr<RestoredShard> again = RestoreShard(*set, 0);
  REQUIRE_OK(again.status());
  CHECK(Slices(*again->store) == trained);
}

TEST_CASE(
    "a checkpoint directory that cannot be listed is an error, not an "
    "empty directory",
    "[checkpoint_dir][faults]") {
  const std::string dir = testing::MakeTmpDir("unlistable");
  WriteShard(dir, 0, 2);
  WriteShard(dir, 1, 2);
  testing::FaultFileSystem fs;
  for (int err : {EACCES, EIO}) {
    fs.ClearPathFaults();
    fs.FailListing(dir, err);
    const absl::Status listed = ListShardFiles(dir, &fs).status();
    INFO(listed.ToString());
    CHECK(listed.code() == CodeOf(err));
    CHECK(Names(listed, dir));
    if (err == EACCES) CHECK(absl::IsPermissionDenied(listed));
    for (bool restore : {true, false}) {
      CheckpointDirUse use{dir, 0, 2, kRun, "", restore};
      use.fs = &fs;
      const absl::Status checked = CheckCheckpointDir(use);
      INFO(checked.ToString());
      CHECK(checked.code() == CodeOf(err));
      CHECK(Names(checked, dir));
    }
    const absl::Status found = FindShardFileSet(dir, &fs).status();
    CHECK(found.code() == CodeOf(err));
    CHECK(Names(found, dir));
  }

  // This shard's files are read for their run: a fault there is an error
  // naming the file (a restart does not start past it).
  const std::string ckpt = CheckpointPath(dir, 1, 2);
  CheckpointDirUse use{dir, 1, 2, kRun, "", true};
  use.fs = &fs;
  fs.ClearPathFaults();
  fs.VanishAfterListing(ckpt);
  absl::Status s = CheckCheckpointDir(use);
  INFO(s.ToString());
  CHECK(absl::IsNotFound(s));
  CHECK(Names(s, ckpt));
  fs.ClearPathFaults();
  fs.TruncateReads(ckpt, 10);  // not even the header
  s = CheckCheckpointDir(use);
  INFO(s.ToString());
  CHECK(absl::IsDataLoss(s));
  CHECK(Names(s, ckpt));
  fs.ClearPathFaults();
  fs.FailReads(SpecFilePath(dir, 1, 2));
  s = CheckCheckpointDir(use);
  INFO(s.ToString());
  CHECK(s.code() == CodeOf(EIO));
  CHECK(Names(s, SpecFilePath(dir, 1, 2)));
  // Not restoring: only the listing is read.
  use.restore = false;
  CHECK(CheckCheckpointDir(use).ok());

  fs.ClearPathFaults();
  use.restore = true;
  REQUIRE_OK(CheckCheckpointDir(use));
}

TEST_CASE("a reshard whose reads fail refuses and writes nothing",
          "[reshard][faults]") {
  const std::string from = testing::MakeTmpDir("reshard_from");
  WriteShard(from, 0, 2);
  WriteShard(from, 1, 2);
  const std::string parent = testing::MakeTmpDir("reshard_to");
  int attempt = 0;
  // A reshard into a new directory under `parent` through `fs`: its error,
  // and that it wrote nothing (the directory was not even created).
  auto reshard = [&](testing::FaultFileSystem* fs) {
    const std::string to = absl::StrCat(parent, "/out", attempt++);
    absl::StatusOr<ReshardReport> r = Reshard({from, to, 3, fs});
    if (!r.ok()) {
      CHECK(absl::IsNotFound(FileSystem::Default()->Stat(to).status()));
    }
    return r.status();
  };
  testing::FaultFileSystem fs;

  SECTION("the old shards' directory cannot be listed") {
    fs.FailListing(from, EACCES);
    const absl::Status s = reshard(&fs);
    INFO(s.ToString());
    CHECK(absl::IsPermissionDenied(s));
    CHECK(Names(s, from));
  }
  SECTION("a checkpoint reads back truncated") {
    const std::string ckpt = CheckpointPath(from, 1, 2);
    fs.TruncateReads(ckpt, SizeOf(ckpt) - 1);
    const absl::Status s = reshard(&fs);
    INFO(s.ToString());
    CHECK(absl::IsDataLoss(s));
    CHECK(Names(s, ckpt));
  }
  SECTION("a spec file's reads fail") {
    const std::string specs = SpecFilePath(from, 0, 2);
    fs.FailReads(specs);
    const absl::Status s = reshard(&fs);
    INFO(s.ToString());
    CHECK(s.code() == CodeOf(EIO));
    CHECK(Names(s, specs));
  }
  SECTION("a checkpoint vanishes between the listing and its open") {
    const std::string ckpt = CheckpointPath(from, 0, 2);
    fs.VanishAfterListing(ckpt);
    const absl::Status s = reshard(&fs);
    INFO(s.ToString());
    CHECK(absl::IsNotFound(s));
    CHECK(Names(s, ckpt));
  }
  SECTION("the new directory cannot be listed") {
    const std::string to = absl::StrCat(parent, "/out", attempt);
    fs.FailListing(to, EIO);
    const absl::Status s = reshard(&fs);
    INFO(s.ToString());
    CHECK(s.code() == CodeOf(EIO));
    CHECK(Names(s, to));
  }
  SECTION("any read step fails or reads back short") {
    testing::FaultFileSystem counter;
    REQUIRE_OK(reshard(&counter));
    const std::vector<std::string> ops = counter.log();
    size_t reads = 0;  // every read comes before the first write
    while (reads < ops.size() && IsRead(ops[reads])) ++reads;
    REQUIRE(reads >= 16);  // 2 listings, 4 files opened and read
    CHECK(absl::StartsWith(ops[reads], "mkdir "));
    for (Fault fault : {Fault::kFailOp, Fault::kShortRead}) {
      for (size_t at = 0; at < reads; ++at) {
        testing::FaultFileSystem faulty;
        faulty.Arm(static_cast<int>(at), fault);
        const absl::Status s = reshard(&faulty);
        INFO("fault " << static_cast<int>(fault) << " at " << ops[at] << ": "
                      << s);
        REQUIRE(!s.ok());
        // Each attempt has a target directory of its own under `parent`.
        const std::string path = PathOf(ops[at]);
        CHECK(Names(s, absl::StartsWith(path, parent) ? parent : path));
        if (fault == Fault::kShortRead && absl::StartsWith(ops[at], "read ")) {
          CHECK(absl::IsDataLoss(s));
        } else {
          CHECK(s.code() == CodeOf(EIO));
        }
      }
    }
  }

  // The old files are intact: without faults the reshard succeeds.
  fs.ClearPathFaults();
  REQUIRE_OK(reshard(&fs));
}

}  // namespace
}  // namespace asyncps
