#ifndef ASYNCPS_COMMON_MEMORY_LIMIT_H_
#define ASYNCPS_COMMON_MEMORY_LIMIT_H_

// How much memory this process may use: the machine's physical memory, or
// less where its control group (a container's, a pod's, a Slurm job's) has
// a memory limit. A process in a cgroup that exceeds its limit is killed by
// the kernel without warning, so sizes derived from "the memory" must come
// from here, not from the machine's total.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace asyncps {

// Where ReadMemoryLimit looks; the defaults are the real ones, tests point
// them at a fake tree.
struct MemoryLimitSources {
  std::string proc_self_cgroup = "/proc/self/cgroup";
  std::string cgroup_root = "/sys/fs/cgroup";
  uint64_t physical_bytes = 0;  // 0 = the machine's (sysconf)
};

struct MemoryLimit {
  uint64_t physical_bytes = 0;
  // The tightest memory limit of the process's cgroup and its ancestors
  // (cgroup v2 memory.max, or v1 memory.limit_in_bytes), when there is one
  // below the physical memory.
  std::optional<uint64_t> cgroup_bytes;
  std::string cgroup_file;  // the file that set cgroup_bytes

  uint64_t effective() const {
    return cgroup_bytes.has_value() && *cgroup_bytes < physical_bytes
               ? *cgroup_bytes
               : physical_bytes;
  }
};

// Reads the physical memory and the cgroup limit: cgroup v2 (a "0::<path>"
// line in /proc/self/cgroup: <root><path>/memory.max and those of its
// ancestors) or, failing that, v1 (the "memory" controller's line:
// <root>/memory<path>/memory.limit_in_bytes and its ancestors'). Missing
// files and "max" mean no limit there; unreadable cgroup information means
// no cgroup limit. Errors only when the physical memory cannot be read.
absl::StatusOr<MemoryLimit> ReadMemoryLimit(
    const MemoryLimitSources& sources = {});

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_MEMORY_LIMIT_H_
