// ps_server's staleness flags: a bad value exits with status 2 and a message
// naming the flag; good values show as the policy in the Status RPC.

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/net.h"
#include "proto/asyncps.grpc.pb.h"
#include "proto/asyncps.pb.h"
#include "tests/staleness/harness.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace staleness {
namespace {

struct BadFlags {
  std::vector<std::string> args;
  std::string flag;   // must be named in the message
  std::string value;  // the bad value, also in the message
};

TEST_CASE("bad staleness flags exit with status 2 naming the flag", "[flags]") {
  const std::vector<BadFlags> cases = {
      {{"--consistency=bogus"}, "--consistency", "bogus"},
      {{"--consistency=asp", "--ssp_slack=2"}, "--ssp_slack", "asp"},
      {{"--consistency=bsp", "--ssp_slack=1"}, "--ssp_slack", "bsp"},
      {{"--consistency=ssp", "--ssp_slack=-5"}, "--ssp_slack", "-5"},
      {{"--max_staleness=-3"}, "--max_staleness", "-3"},
      {{"--staleness_lr=sqrt"}, "--staleness_lr", "sqrt"},
      {{"--worker_lease_ms=0"}, "--worker_lease_ms", "0"},
      {{"--pull_wait_timeout_ms=-1"}, "--pull_wait_timeout_ms", "-1"},
  };
  for (const BadFlags& c : cases) {
    std::vector<std::string> args = c.args;
    // Were the flags accepted, the shard would start serving and the wait
    // below would time out.
    args.push_back("--port=0");
    INFO("ps_server " << absl::StrJoin(args, " "));
    absl::StatusOr<std::unique_ptr<testing::Subprocess>> server =
        testing::Subprocess::Start(testing::RunfilePath("server/ps_server"),
                                   args);
    REQUIRE_OK(server.status());
    absl::StatusOr<int> code = (*server)->Wait(absl::Seconds(10));
    const std::string log = (*server)->ReadLog();
    INFO("output:\n" << log);
    REQUIRE_OK(code.status());
    CHECK(*code == 2);
    CHECK(absl::StrContains(log, c.flag));
    CHECK(absl::StrContains(log, c.value));
  }
}

StatusResponse StatusOf(const std::vector<std::string>& flags) {
  INFO("ps_server " << absl::StrJoin(flags, " "));
  absl::StatusOr<testing::ServerProcess> server = StartShard(flags);
  REQUIRE_OK(server.status());
  auto stub = ParameterServer::NewStub(MakeChannel(server->address));
  absl::StatusOr<StatusResponse> status = GetStatus(stub.get());
  REQUIRE_OK(status.status());
  // Close the connection first: a shard's graceful shutdown waits for
  // connected clients to hang up (up to its 5 s grace).
  stub.reset();
  absl::StatusOr<int> code = server->process->Kill();
  INFO("server log:\n" << server->process->LogTail());
  REQUIRE_OK(code.status());
  CHECK(*code == 0);
  return *std::move(status);
}

TEST_CASE("the staleness policy shows in Status", "[flags][status]") {
  {
    const StalenessPolicy p =
        StatusOf({"--consistency=ssp", "--ssp_slack=2", "--max_staleness=4",
                  "--staleness_lr=inverse", "--worker_lease_ms=1500",
                  "--pull_wait_timeout_ms=7000"})
            .policy();
    CHECK(p.consistency() == SSP);
    CHECK(p.ssp_slack() == 2);
    CHECK(p.max_staleness() == 4);
    CHECK(p.staleness_lr() == "inverse");
    CHECK(p.worker_lease_ms() == 1500);
    CHECK(p.pull_wait_timeout_ms() == 7000);
  }
  {
    // The defaults.
    const StalenessPolicy p = StatusOf({}).policy();
    CHECK(p.consistency() == ASP);
    CHECK(p.ssp_slack() == 0);
    CHECK(p.max_staleness() == -1);
    CHECK(p.staleness_lr() == "none");
    CHECK(p.worker_lease_ms() == 10000);
    CHECK(p.pull_wait_timeout_ms() == 60000);
  }
  {
    const StalenessPolicy p = StatusOf({"--consistency=ssp"}).policy();
    CHECK(p.consistency() == SSP);
    CHECK(p.ssp_slack() == 3);  // the documented SSP default
  }
  {
    const StalenessPolicy p =
        StatusOf({"--consistency=bsp", "--max_staleness=0"}).policy();
    CHECK(p.consistency() == BSP);
    CHECK(p.ssp_slack() == 0);
    CHECK(p.max_staleness() == 0);
  }
}

}  // namespace
}  // namespace staleness
}  // namespace asyncps
