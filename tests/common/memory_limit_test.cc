// The memory a process may use, read from fake /proc/self/cgroup files and
// cgroup trees: cgroup v2 memory.max (the tightest of the cgroup and its
// ancestors, "max" = none), v1 memory.limit_in_bytes (its "unlimited" huge
// value = none), no cgroup information at all.

#include "common/memory_limit.h"

#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

// A fake root with the files given (path relative to the root -> content).
struct FakeTree {
  std::string root;
  explicit FakeTree(const std::string& stem)
      : root(testing::MakeTmpDir(stem)) {}
  void Write(const std::string& path, const std::string& text) {
    size_t at = 0;
    while ((at = path.find('/', at + 1)) != std::string::npos) {
      ::mkdir((root + path.substr(0, at)).c_str(), 0755);
    }
    std::ofstream(root + path) << text;
  }
  MemoryLimitSources Sources() const {
    MemoryLimitSources s;
    s.proc_self_cgroup = root + "/proc/self/cgroup";
    s.cgroup_root = root + "/sys/fs/cgroup";
    s.physical_bytes = 64 * kGiB;
    return s;
  }
};

TEST_CASE("cgroup v2: the tightest memory.max on the way to the root",
          "[memory_limit]") {
  FakeTree t("v2");
  t.Write("/proc/self/cgroup", "0::/kubepods/pod1/shard\n");
  t.Write("/sys/fs/cgroup/kubepods/pod1/shard/memory.max", "max\n");
  t.Write("/sys/fs/cgroup/kubepods/pod1/memory.max", "4294967296\n");
  t.Write("/sys/fs/cgroup/kubepods/memory.max", "17179869184\n");
  absl::StatusOr<MemoryLimit> m = ReadMemoryLimit(t.Sources());
  REQUIRE_OK(m.status());
  REQUIRE(m->cgroup_bytes.has_value());
  CHECK(*m->cgroup_bytes == 4 * kGiB);
  CHECK(m->effective() == 4 * kGiB);
  CHECK(m->cgroup_file == t.root + "/sys/fs/cgroup/kubepods/pod1/memory.max");
}

TEST_CASE("cgroup v2 inside a container: the namespace root's memory.max",
          "[memory_limit]") {
  FakeTree t("ns");
  t.Write("/proc/self/cgroup", "0::/\n");
  t.Write("/sys/fs/cgroup/memory.max", "2147483648\n");
  absl::StatusOr<MemoryLimit> m = ReadMemoryLimit(t.Sources());
  REQUIRE_OK(m.status());
  CHECK(m->effective() == 2 * kGiB);
}

TEST_CASE("cgroup v1: memory.limit_in_bytes; its unlimited value is none",
          "[memory_limit]") {
  FakeTree t("v1");
  t.Write("/proc/self/cgroup",
          "12:cpu,cpuacct:/slurm/job1\n7:memory:/slurm/job1/step0\n"
          "1:name=systemd:/x\n");
  t.Write("/sys/fs/cgroup/memory/slurm/job1/step0/memory.limit_in_bytes",
          "9223372036854771712\n");
  t.Write("/sys/fs/cgroup/memory/slurm/job1/memory.limit_in_bytes",
          "8589934592\n");
  absl::StatusOr<MemoryLimit> m = ReadMemoryLimit(t.Sources());
  REQUIRE_OK(m.status());
  CHECK(m->effective() == 8 * kGiB);

  FakeTree u("v1-unlimited");
  u.Write("/proc/self/cgroup", "7:memory:/\n");
  u.Write("/sys/fs/cgroup/memory/memory.limit_in_bytes",
          "9223372036854771712\n");
  m = ReadMemoryLimit(u.Sources());
  REQUIRE_OK(m.status());
  CHECK_FALSE(m->cgroup_bytes.has_value());
  CHECK(m->effective() == 64 * kGiB);
}

TEST_CASE("no cgroup information, or a limit above the machine's memory",
          "[memory_limit]") {
  FakeTree t("none");
  absl::StatusOr<MemoryLimit> m = ReadMemoryLimit(t.Sources());
  REQUIRE_OK(m.status());
  CHECK_FALSE(m->cgroup_bytes.has_value());
  CHECK(m->effective() == 64 * kGiB);

  FakeTree big("big");
  big.Write("/proc/self/cgroup", "0::/a\n");
  big.Write("/sys/fs/cgroup/a/memory.max", "137438953472\n");  // 128 GiB
  m = ReadMemoryLimit(big.Sources());
  REQUIRE_OK(m.status());
  CHECK_FALSE(m->cgroup_bytes.has_value());

  // The real machine: some physical memory, whatever the cgroups say.
  m = ReadMemoryLimit();
  REQUIRE_OK(m.status());
  CHECK(m->physical_bytes > 0);
  CHECK(m->effective() <= m->physical_bytes);
}

}  // namespace
}  // namespace asyncps
