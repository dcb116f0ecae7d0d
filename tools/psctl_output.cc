#include "tools/psctl_output.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace asyncps {

int UsageError(const std::string& message) {
  std::fprintf(stderr, "psctl: %s\n", message.c_str());
  return kExitUsage;
}

namespace {

// The first error of a write to stdout (0: none yet; -1: one whose errno
// is not known any more).
int output_errno = 0;

void NoteOutputError() {
  if (output_errno == 0) output_errno = errno != 0 ? errno : -1;
}

}  // namespace

void Print(const std::string& out) {
  errno = 0;
  if (std::fwrite(out.data(), 1, out.size(), stdout) != out.size() ||
      std::fflush(stdout) != 0) {
    NoteOutputError();
  }
}

int OutputWritten(int code) {
  errno = 0;
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) NoteOutputError();
  if (output_errno == 0 || output_errno == EPIPE) return code;
  std::fprintf(stderr, "psctl: cannot write the output: %s\n",
               output_errno > 0 ? std::strerror(output_errno) : "write error");
  return code == 0 ? kExitDown : code;
}

std::string Render(const Doc& doc, Format format) {
  return format == Format::kYaml ? doc.Yaml() : doc.Json();
}

}  // namespace asyncps
