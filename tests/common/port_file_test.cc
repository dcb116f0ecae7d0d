// WritePortFile (common/port_file.h): the file holds the whole line or is
// not there, and a write that fails (a full disk, a file size limit) is an
// error naming the file, never an empty or cut port file.

#include "common/port_file.h"

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

std::string Contents(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST_CASE("a port file holds the port's line, written whole or not at all",
          "[port_file]") {
  const std::string dir = testing::MakeTmpDir("port_file");
  const std::string path = dir + "/port";

  SECTION("written") {
    REQUIRE(WritePortFile(path, 45233).ok());
    CHECK(Contents(path) == "45233\n");
    CHECK_FALSE(Exists(path + ".tmp"));
  }
  SECTION("a directory that is not there") {
    const absl::Status s = WritePortFile(dir + "/none/port", 45233);
    CHECK(absl::IsNotFound(s));
    CHECK(absl::StrContains(s.message(), dir + "/none/port.tmp"));
  }
  SECTION("a write cut short by the file size limit, as by a full disk") {
    // In a child: the limit would cut this process's own output too.
    const int status = testing::ExitStatusInChild([&path] {
      signal(SIGXFSZ, SIG_IGN);
      const struct rlimit three = {3, 3};
      setrlimit(RLIMIT_FSIZE, &three);
      const absl::Status s = WritePortFile(path, 45233);
      if (s.ok()) return 10;
      if (!absl::StrContains(s.message(), "cannot write " + path + ".tmp")) {
        return 11;
      }
      return 0;
    });
    CHECK(status == 0);
    CHECK_FALSE(Exists(path));  // no cut or empty file
    CHECK_FALSE(Exists(path + ".tmp"));
  }
}

}  // namespace
}  // namespace asyncps
