#include "common/memory_limit.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace asyncps {
namespace {

std::optional<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The limit in `file`: a byte count; "max", a missing file or anything
// else is no limit.
std::optional<uint64_t> ReadLimit(const std::string& file) {
  std::optional<std::string> text = ReadSmallFile(file);
  if (!text.has_value()) return std::nullopt;
  uint64_t bytes = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &bytes)) {
    return std::nullopt;
  }
  return bytes;
}

// The tightest limit of <base><path>/<name> and of every ancestor of
// <path> up to <base>/<name>.
void TightestAlongPath(const std::string& base, std::string path,
                       const std::string& name, MemoryLimit* out) {
  while (!path.empty() && path.back() == '/') path.pop_back();
  for (;;) {
    const std::string file = absl::StrCat(base, path, "/", name);
    const std::optional<uint64_t> limit = ReadLimit(file);
    if (limit.has_value() &&
        (!out->cgroup_bytes.has_value() || *limit < *out->cgroup_bytes)) {
      out->cgroup_bytes = *limit;
      out->cgroup_file = file;
    }
    if (path.empty()) return;
    const size_t slash = path.rfind('/');
    path.resize(slash == std::string::npos ? 0 : slash);
  }
}

}  // namespace

absl::StatusOr<MemoryLimit> ReadMemoryLimit(const MemoryLimitSources& sources) {
  MemoryLimit out;
  out.physical_bytes = sources.physical_bytes;
  if (out.physical_bytes == 0) {
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long page = sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page <= 0) {
      return absl::InternalError("cannot read the machine's memory size");
    }
    out.physical_bytes =
        static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
  }
  const std::optional<std::string> cgroups =
      ReadSmallFile(sources.proc_self_cgroup);
  if (!cgroups.has_value()) return out;
  std::optional<std::string> v2_path, v1_path;
  for (absl::string_view line : absl::StrSplit(*cgroups, '\n')) {
    // hierarchy-id:controllers:path (the path may hold ':' itself).
    const std::vector<absl::string_view> f =
        absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    if (f[0] == "0" && f[1].empty()) {
      v2_path = std::string(f[2]);
      continue;
    }
    for (absl::string_view c : absl::StrSplit(f[1], ',')) {
      if (c == "memory") v1_path = std::string(f[2]);
    }
  }
  if (v2_path.has_value()) {
    TightestAlongPath(sources.cgroup_root, *v2_path, "memory.max", &out);
  }
  if (!out.cgroup_bytes.has_value() && v1_path.has_value()) {
    TightestAlongPath(absl::StrCat(sources.cgroup_root, "/memory"), *v1_path,
                      "memory.limit_in_bytes", &out);
  }
  // v1 reports "no limit" as a huge number (LONG_MAX rounded to pages).
  if (out.cgroup_bytes.has_value() && *out.cgroup_bytes >= out.physical_bytes) {
    out.cgroup_bytes.reset();
    out.cgroup_file.clear();
  }
  return out;
}

}  // namespace asyncps
