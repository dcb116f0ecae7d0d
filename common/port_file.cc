#include "common/port_file.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace asyncps {
namespace {

absl::Status Errno(int err, const std::string& what) {
  return absl::Status(absl::ErrnoToStatusCode(err),
                      absl::StrCat(what, ": ", std::strerror(err)));
}

}  // namespace

absl::Status WritePortFile(const std::string& path, int port) {
  const std::string tmp = path + ".tmp";
  const std::string line = absl::StrCat(port, "\n");
  const int fd =
      open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno(errno, "cannot create " + tmp);
  // One short write: it lands whole or fails (a full disk), and close
  // reports what a file system defers.
  const ssize_t n = write(fd, line.data(), line.size());
  const int write_errno = n < 0 ? errno : ENOSPC;
  const bool written = n == static_cast<ssize_t>(line.size());
  const bool closed = close(fd) == 0;
  if (!written || !closed) {
    const int err = !written ? write_errno : errno;
    unlink(tmp.c_str());
    return Errno(err, "cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return Errno(err, absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

}  // namespace asyncps
