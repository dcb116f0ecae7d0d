// A replicated group on an etcd with authentication enabled (its RBAC),
// with real processes: the servers, their clients and psctl are a user
// allowed only under /asyncps/ (--etcd_user, --etcd_password_file); the
// group takes pushes and fails over as on an open etcd; a server with a
// wrong password exits 2 saying so (and warns of a password file others
// may read).

#include <signal.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "client/ps_client.h"
#include "tests/replication/replica_harness.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/test_pki.h"

namespace asyncps {
namespace {

constexpr int kElems = 100;

TEST_CASE(
    "a group on an etcd with authentication: a user allowed under /asyncps/ "
    "serves, fails over and is watched",
    "[replication][etcd][auth]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  REQUIRE_OK(
      testing::EtcdEnableAuth(&*etcd, "trainer", "pw-0123456789", "/asyncps/"));
  {
    std::vector<std::string> args = testing::ReplicaArgs(*etcd, "auth");
    const std::string wrong = etcd->password_file + ".wrong";
    testing::WriteFile(wrong, "not-it\n");
    chmod(wrong.c_str(), 0644);
    args.push_back("--etcd_password_file=" + wrong);  // the last one counts
    auto [exit, log] = testing::RunServer(args);
    INFO(log);
    CHECK(exit == 2);
    CHECK(absl::StrContains(log, "authenticate as 'trainer'"));
    // A password others may read is said (the right one is 0600).
    CHECK(absl::StrContains(log, "--etcd_password_file " + wrong +
                                     " is accessible to other users"));
  }
  testing::ServerProcess a, b;
  testing::StartReplicaPair(*etcd, "auth", &a, &b);
  std::unique_ptr<PsClient> c = testing::MapClient(*etcd, "auth");
  REQUIRE_OK(c->CreateTensors({testing::UnitTensor(kElems)}));
  testing::PushOnes(c.get(), kElems, 0, 10);
  {
    auto [exit, out] = testing::Psctl(*etcd, "auth");
    INFO(out);
    CHECK(exit == 0);
    CHECK(absl::StrContains(out, "primary"));
  }
  // The backup writes the map that makes it the primary, as the user.
  REQUIRE_OK(a.process->Signal(SIGKILL));
  (void)a.process->Wait(absl::Seconds(10));
  testing::WaitForRole(b.address, "primary");
  testing::PushOnes(c.get(), kElems, 10, 10);
  testing::ExpectEvery(c.get(), kElems, 20, 1.0f - 20);
}

}  // namespace
}  // namespace asyncps
