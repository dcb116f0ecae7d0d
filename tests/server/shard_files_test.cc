// The files of a shard's checkpoint directory besides the checkpoint: the
// spec file (round trip, corruption, re-creating the tensors a checkpoint
// lacks with their initial values, conflicting specs), the journal that
// keeps it current, which files a shard may use (shard count, run,
// adoption), and the directory's own id.

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/names.h"
#include "server/checkpoint.h"
#include "server/checkpoint_dir.h"
#include "server/checkpoint_dir_id.h"
#include "server/checkpoint_lock.h"
#include "server/spec_file.h"
#include "store/shard_store.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/store_helpers.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/table_helpers.h"
#include "tests/testing/tensor_specs.h"

namespace asyncps {
namespace {

std::unique_ptr<ShardStore> Store(int shard = 0, int shards = 2) {
  ShardStoreOptions o;
  o.shard_index = shard;
  o.num_shards = shards;
  return ShardStore::Create(o).value();
}

TensorSpec Spec(const std::string& name, float init) {
  return testing::ConstantSpec(name, {10}, init, testing::SgdSpec(0.5f), 4);
}

CheckpointIdentity Identity(int shard, int shards, const std::string& run) {
  CheckpointIdentity id;
  id.set_shard_index(shard);
  id.set_num_shards(shards);
  id.set_run_id(run);
  return id;
}

std::vector<float> Values(ShardStore* store, const std::string& tensor) {
  PullRequest req;
  req.add_tensors(tensor);
  PullResponse resp;
  REQUIRE_OK(store->Pull(req, &resp));
  std::vector<float> out;
  for (const SliceData& d : resp.slices()) {
    const float* f = reinterpret_cast<const float*>(d.values().data());
    out.insert(out.end(), f, f + d.values().size() / sizeof(float));
  }
  return out;
}

TEST_CASE("a spec file round-trips and re-creates what a checkpoint lacks",
          "[spec_file]") {
  const std::string dir = testing::MakeTmpDir("specs");
  const std::string path = SpecFilePath(dir, 0, 2);
  CHECK(absl::EndsWith(path, "/shard-0-of-2.specs"));
  SpecFileContents written;
  written.identity = Identity(0, 2, "r1");
  written.tensors = {Spec("a", 1.0f), Spec("b", 2.0f)};
  written.tables = {testing::MakeTableSpec("emb", 3, testing::SgdSpec(0.1f))};
  REQUIRE_OK(WriteSpecFile(path, written));
  absl::StatusOr<SpecFileContents> read = ReadSpecFile(path);
  REQUIRE_OK(read.status());
  CHECK(read->identity.run_id() == "r1");
  REQUIRE(read->tensors.size() == 2);
  CHECK(read->tensors[1].name() == "b");
  REQUIRE(read->tables.size() == 1);

  // A store restored from a checkpoint holding only "a", trained.
  std::unique_ptr<ShardStore> trained = Store();
  CreateTensorRequest create;
  *create.add_tensors() = Spec("a", 1.0f);
  REQUIRE_OK(trained->CreateTensors(create).status());
  REQUIRE_OK(testing::WriteStoreCheckpoint(*trained, dir).status());
  std::unique_ptr<ShardStore> restored = Store();
  REQUIRE_OK(
      RestoreCheckpoint(CheckpointPath(dir, 0, 2), restored.get()).status());
  absl::StatusOr<int> created = ApplySpecFile(*read, path, restored.get());
  REQUIRE_OK(created.status());
  CHECK(*created == 2);  // "b" and the table
  CHECK(restored->tables().Contains("emb"));
  for (float v : Values(restored.get(), "b")) CHECK(v == 2.0f);
  // Applying it again changes nothing.
  created = ApplySpecFile(*read, path, restored.get());
  REQUIRE_OK(created.status());
  CHECK(*created == 0);

  SECTION("a spec that differs from the checkpoint's is refused") {
    SpecFileContents other = *read;
    other.tensors[0] = Spec("a", 9.0f);
    absl::StatusOr<int> r = ApplySpecFile(other, path, restored.get());
    CHECK(absl::IsDataLoss(r.status()));
    CHECK(absl::StrContains(r.status().message(), "'a'"));
  }
  SECTION("a corrupt or absent file") {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    f.put('\x7f');
    f.close();
    CHECK(absl::IsDataLoss(ReadSpecFile(path).status()));
    CHECK(absl::IsNotFound(ReadSpecFile(path + ".none").status()));
  }
}

TEST_CASE("the journal writes the spec file only when specs were added",
          "[spec_file]") {
  const std::string dir = testing::MakeTmpDir("journal");
  std::unique_ptr<ShardStore> store = Store();
  SpecJournal journal(SpecFilePath(dir, 0, 2), Identity(0, 2, "r2"),
                      store.get());
  REQUIRE_OK(journal.Sync());
  CHECK(absl::IsNotFound(ReadSpecFile(journal.path()).status()));
  CreateTensorRequest create;
  *create.add_tensors() = Spec("a", 1.0f);
  REQUIRE_OK(store->CreateTensors(create).status());
  REQUIRE_OK(journal.Sync());
  absl::StatusOr<SpecFileContents> read = ReadSpecFile(journal.path());
  REQUIRE_OK(read.status());
  CHECK(read->identity.run_id() == "r2");
  CHECK(read->tensors.size() == 1);
  REQUIRE(std::remove(journal.path().c_str()) == 0);
  REQUIRE_OK(journal.Sync());  // nothing new: not written again
  CHECK(absl::IsNotFound(ReadSpecFile(journal.path()).status()));
  *create.mutable_tensors(0) = Spec("c", 3.0f);
  REQUIRE_OK(store->CreateTensors(create).status());
  REQUIRE_OK(journal.Sync());
  read = ReadSpecFile(journal.path());
  REQUIRE_OK(read.status());
  CHECK(read->tensors.size() == 2);
}

TEST_CASE("a journal told what its file holds writes only what it lacks",
          "[spec_file]") {
  const std::string dir = testing::MakeTmpDir("journal_known");
  std::unique_ptr<ShardStore> store = Store();
  CreateTensorRequest create;
  *create.add_tensors() = Spec("a", 1.0f);
  *create.add_tensors() = Spec("b", 2.0f);
  REQUIRE_OK(store->CreateTensors(create).status());
  const std::string path = SpecFilePath(dir, 0, 2);
  SpecFileContents on_disk;
  on_disk.identity = Identity(0, 2, "r2");
  on_disk.tensors = store->ListTensors();
  std::reverse(on_disk.tensors.begin(), on_disk.tensors.end());  // any order

  SECTION("the store's specs under its identity: nothing to write") {
    SpecJournal journal(path, Identity(0, 2, "r2"), store.get());
    journal.Known(on_disk);
    REQUIRE_OK(journal.Sync());
    CHECK(absl::IsNotFound(ReadSpecFile(path).status()));
    // A spec added later is written.
    *create.mutable_tensors(0) = Spec("c", 3.0f);
    create.mutable_tensors()->DeleteSubrange(1, 1);
    REQUIRE_OK(store->CreateTensors(create).status());
    REQUIRE_OK(journal.Sync());
    absl::StatusOr<SpecFileContents> read = ReadSpecFile(path);
    REQUIRE_OK(read.status());
    CHECK(read->tensors.size() == 3);
  }
  SECTION("a spec fewer, another spec or another identity: written") {
    SpecJournal journal(path, Identity(0, 2, "r2"), store.get());
    SECTION("a spec fewer") { on_disk.tensors.pop_back(); }
    SECTION("another spec") { on_disk.tensors[0] = Spec("b", 5.0f); }
    SECTION("another run") { on_disk.identity = Identity(0, 2, "r1"); }
    journal.Known(on_disk);
    REQUIRE_OK(journal.Sync());
    absl::StatusOr<SpecFileContents> read = ReadSpecFile(path);
    REQUIRE_OK(read.status());
    CHECK(read->identity.run_id() == "r2");
    CHECK(read->tensors.size() == 2);
  }
}

TEST_CASE("a shard uses only files of its shard count and run",
          "[checkpoint_dir]") {
  const std::string dir = testing::MakeTmpDir("dir");
  CHECK(CheckCheckpointDir({dir, 0, 2, "r1", "", true}).ok());
  CHECK(CheckCheckpointDir({dir + "/absent", 0, 2, "r1", "", true}).ok());
  std::unique_ptr<ShardStore> store = Store(1, 2);
  REQUIRE_OK(
      WriteCheckpoint(CaptureCheckpoint(*store, {}, absl::Now(), "", "r1"), dir)
          .status());
  SpecFileContents specs;
  specs.identity = Identity(1, 2, "r1");
  REQUIRE_OK(WriteSpecFile(SpecFilePath(dir, 1, 2), specs));
  std::ofstream(dir + "/shard-1-of-2.ckpt.tmp") << "leftover";
  std::ofstream(dir + "/notes.txt") << "not a shard file";
  absl::StatusOr<std::vector<ShardFile>> files = ListShardFiles(dir);
  REQUIRE_OK(files.status());
  REQUIRE(files->size() == 2);
  CHECK_FALSE((*files)[0].spec_file);
  CHECK((*files)[1].spec_file);

  // Its own run: fine, for every shard of the count.
  CHECK(CheckCheckpointDir({dir, 1, 2, "r1", "", true}).ok());
  CHECK(CheckCheckpointDir({dir, 0, 2, "other", "", true}).ok());

  // Another shard count: refused, naming the files, restore or not.
  for (bool restore : {true, false}) {
    const absl::Status s = CheckCheckpointDir({dir, 0, 3, "r1", "", restore});
    CHECK(absl::IsFailedPrecondition(s));
    CHECK(absl::StrContains(s.message(), "shard-1-of-2.ckpt"));
    CHECK(absl::StrContains(s.message(), "shard-1-of-2.specs"));
    CHECK(absl::StrContains(s.message(), "psctl reshard"));
  }

  // Another run: refused unless adopted, or not restored.
  const absl::Status other = CheckCheckpointDir({dir, 1, 2, "r2", "", true});
  CHECK(absl::IsFailedPrecondition(other));
  CHECK(absl::StrContains(other.message(), "'r1'"));
  CHECK(absl::StrContains(other.message(), "--adopt_run=r1"));
  CHECK(CheckCheckpointDir({dir, 1, 2, "r2", "r1", true}).ok());
  CHECK(CheckCheckpointDir({dir, 1, 2, "r2", kAdoptAnyRun, true}).ok());
  CHECK(absl::IsFailedPrecondition(
      CheckCheckpointDir({dir, 1, 2, "r2", "r3", true})));
  CHECK(CheckCheckpointDir({dir, 1, 2, "r2", "", false}).ok());

  // A file whose identity cannot be read is corrupt.
  std::ofstream(CheckpointPath(dir, 1, 2), std::ios::trunc) << "garbage";
  CHECK(absl::IsDataLoss(CheckCheckpointDir({dir, 1, 2, "r1", "", true})));
}

TEST_CASE("a checkpoint directory keeps the id it gave itself",
          "[checkpoint_dir]") {
  const std::string dir = testing::MakeTmpDir("dir_id") + "/replica";
  absl::StatusOr<std::string> id = CheckpointDirId(dir);
  REQUIRE_OK(id.status());
  CHECK(id->size() == 32);
  CHECK(id->find_first_not_of("0123456789abcdef") == std::string::npos);
  // The same directory, the same id; another directory, another.
  absl::StatusOr<std::string> again = CheckpointDirId(dir);
  REQUIRE_OK(again.status());
  CHECK(*again == *id);
  absl::StatusOr<std::string> other = CheckpointDirId(dir + "-2");
  REQUIRE_OK(other.status());
  CHECK(*other != *id);
  // Not a shard file: listed by none, refused by no shard.
  absl::StatusOr<std::vector<ShardFile>> files = ListShardFiles(dir);
  REQUIRE_OK(files.status());
  CHECK(files->empty());
  CHECK(CheckCheckpointDir({dir, 0, 2, "r1", "", true}).ok());

  // A corrupt id is said, naming the file, and not replaced.
  std::ofstream(CheckpointDirIdPath(dir), std::ios::trunc) << "garbage";
  const absl::Status corrupt = CheckpointDirId(dir).status();
  CHECK(absl::IsDataLoss(corrupt));
  CHECK(absl::StrContains(corrupt.message(), CheckpointDirIdPath(dir)));
  std::ifstream kept(CheckpointDirIdPath(dir));
  CHECK(std::string(std::istreambuf_iterator<char>(kept), {}) == "garbage");
  // A directory that cannot be made: the error, no id.
  std::ofstream(dir + "/file") << "x";
  CHECK_FALSE(CheckpointDirId(dir + "/file/sub").ok());
}

TEST_CASE("a shard's files stay locked when the holder's id cannot be written",
          "[checkpoint_lock]") {
  const std::string dir = testing::MakeTmpDir("lock_full");
  // In a child, whose file size limit of 0 fails the id's write (EFBIG) as
  // a full disk would (ENOSPC).
  const int status = testing::ExitStatusInChild([&dir] {
    signal(SIGXFSZ, SIG_IGN);
    const struct rlimit none = {0, 0};
    setrlimit(RLIMIT_FSIZE, &none);
    absl::StatusOr<std::unique_ptr<CheckpointLock>> held =
        CheckpointLock::Acquire(dir, 0, 2, {});
    if (!held.ok()) return 10;
    // Another holder (a descriptor of its own) is refused, the holder
    // unnamed.
    absl::StatusOr<std::unique_ptr<CheckpointLock>> second =
        CheckpointLock::Acquire(dir, 0, 2, {});
    if (!absl::IsFailedPrecondition(second.status())) return 11;
    if (!absl::StrContains(second.status().message(),
                           "in use by another process")) {
      return 12;
    }
    return 0;
  });
  CHECK(status == 0);
}

TEST_CASE("run ids are checked", "[checkpoint_dir]") {
  CHECK(CheckRunId("").ok());
  CHECK(CheckRunId("job-1234.a_b:c@d/e+f").ok());
  CHECK(absl::IsInvalidArgument(CheckRunId("has space")));
  CHECK(absl::IsInvalidArgument(CheckRunId("any")));
  CHECK(absl::IsInvalidArgument(CheckRunId(std::string(129, 'x'))));
}

}  // namespace
}  // namespace asyncps
