#include "tools/psctl_output.h"

#include <cstdio>

namespace asyncps {

int UsageError(const std::string& message) {
  std::fprintf(stderr, "psctl: %s\n", message.c_str());
  return kExitUsage;
}

void Print(const std::string& out) {
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
}

std::string Render(const Doc& doc, Format format) {
  return format == Format::kYaml ? doc.Yaml() : doc.Json();
}

}  // namespace asyncps
