#ifndef ASYNCPS_COMMON_PORT_FILE_H_
#define ASYNCPS_COMMON_PORT_FILE_H_

#include <string>

#include "absl/status/status.h"

namespace asyncps {

// Writes "<port>\n" to `path` through a temporary name and a rename, so a
// reader polling for the file never sees a partial line. Used by servers
// started with port 0, so that launchers and tests learn the bound port.
// A write that fails (a full disk) is an error by errno naming the file,
// and leaves no file behind.
absl::Status WritePortFile(const std::string& path, int port);

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_PORT_FILE_H_
