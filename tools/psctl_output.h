#ifndef ASYNCPS_TOOLS_PSCTL_OUTPUT_H_
#define ASYNCPS_TOOLS_PSCTL_OUTPUT_H_

// How psctl's commands print and exit: the output formats (-o), the exit
// codes, and the two ways out of a command (a result on stdout, a usage
// error on stderr).

#include <string>

#include "tools/doc.h"

namespace asyncps {

enum class Format { kTable, kWide, kJson, kYaml };

// 1: a shard did not answer or a command failed; 2: bad flags or usage.
constexpr int kExitDown = 1;
constexpr int kExitUsage = 2;

// Prints "psctl: <message>" on stderr; returns kExitUsage.
int UsageError(const std::string& message);

// Writes `out` to stdout and flushes.
void Print(const std::string& out);

// The exit code once stdout is flushed: `code`, or kExitDown (said on
// stderr) when some of the output could not be written (a full disk under
// `psctl ... > file`): a script must not take a cut file for a result. A
// reader that went away (EPIPE: `| head`) is not psctl's failure.
int OutputWritten(int code);

// `doc` as YAML for kYaml, else JSON.
std::string Render(const Doc& doc, Format format);

}  // namespace asyncps

#endif  // ASYNCPS_TOOLS_PSCTL_OUTPUT_H_
