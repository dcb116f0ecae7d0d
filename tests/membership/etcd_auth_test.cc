// The etcd client as a user of an etcd with authentication enabled
// (EtcdAccess::user): it asks for a token and sends it with every call and
// watch; keys outside the user's permission are refused; a token that
// lapsed (a simple one or a signed one) is replaced without the caller
// seeing it; a wrong password or no user at all gets nothing.
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "membership/etcd_client.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/test_pki.h"

namespace asyncps {
namespace {

constexpr char kUser[] = "trainer";
constexpr char kPassword[] = "pw-0123456789";

// An etcd with authentication on, kUser allowed to read and write under
// /asyncps/ only, whose tokens lapse after 1 s: simple tokens (etcd's
// default) after 1 s without use, or with `jwt` signed tokens 1 s after
// they were given, used or not.
absl::StatusOr<testing::EtcdProcess> StartAuthEtcd(bool jwt = false) {
  std::string tokens = "--auth-token-ttl=1";
  if (jwt) {
    const std::string dir = testing::TestPki().dir;
    testing::Shell(
        absl::StrCat("cd ", dir,
                     " && openssl genrsa -out jwt.key 2048 && "
                     "openssl rsa -in jwt.key -pubout -out jwt.pub"));
    tokens = absl::StrCat("--auth-token=jwt,pub-key=", dir,
                          "/jwt.pub,priv-key=", dir,
                          "/jwt.key,sign-method=RS256,ttl=1s");
  }
  absl::StatusOr<testing::EtcdProcess> etcd =
      testing::StartEtcd(absl::Seconds(30), {tokens});
  if (!etcd.ok()) return etcd;
  absl::Status s =
      testing::EtcdEnableAuth(&*etcd, kUser, kPassword, "/asyncps/");
  if (!s.ok()) return s;
  return etcd;
}

std::unique_ptr<EtcdClient> Connect(const testing::EtcdProcess& etcd,
                                    const std::string& user,
                                    const std::string& password) {
  EtcdClientOptions o;
  o.endpoints = {etcd.endpoint};
  o.access.user = user;
  o.access.password = password;
  o.call_timeout = absl::Seconds(3);
  absl::StatusOr<std::unique_ptr<EtcdClient>> c = EtcdClient::Connect(o);
  REQUIRE_OK(c.status());
  return *std::move(c);
}

TEST_CASE(
    "a user's calls and watches carry its token, and a lapsed token is "
    "replaced",
    "[etcd][auth]") {
  if (testing::SkipWithoutEtcd()) return;
  const bool jwt = GENERATE(false, true);
  INFO((jwt ? "signed (JWT) tokens" : "simple tokens"));
  absl::StatusOr<testing::EtcdProcess> etcd = StartAuthEtcd(jwt);
  REQUIRE_OK(etcd.status());
  std::unique_ptr<EtcdClient> c = Connect(*etcd, kUser, kPassword);

  absl::StatusOr<int64_t> lease = c->GrantLease(absl::Seconds(5));
  REQUIRE_OK(lease.status());
  REQUIRE_OK(c->Put("/asyncps/run/a", "1", *lease).status());
  absl::StatusOr<std::optional<EtcdKeyValue>> a = c->Get("/asyncps/run/a");
  REQUIRE_OK(a.status());
  REQUIRE(a->has_value());
  CHECK((*a)->value == "1");
  // Outside its permission.
  absl::StatusOr<int64_t> outside = c->Put("/other", "x");
  INFO(outside.status().ToString());
  CHECK_FALSE(outside.ok());
  CHECK(absl::StrContains(outside.status().message(), "permission denied"));

  // Idle past the tokens' 1 s: the next calls and a new watch still work.
  absl::SleepFor(absl::Seconds(3));
  REQUIRE_OK(c->Put("/asyncps/run/b", "2").status());
  absl::SleepFor(absl::Seconds(3));
  absl::Mutex mu;
  std::vector<std::string> seen;
  absl::Status ended;
  std::unique_ptr<EtcdClient::Watcher> w = c->WatchPrefix(
      "/asyncps/run/", 0,
      [&](const std::vector<EtcdEvent>& events, int64_t) {
        absl::MutexLock l(&mu);
        for (const EtcdEvent& e : events) seen.push_back(e.kv.value);
      },
      [&](const absl::Status& s) {
        absl::MutexLock l(&mu);
        ended = s;
      });
  absl::SleepFor(absl::Milliseconds(300));  // the watch starts
  REQUIRE_OK(c->Put("/asyncps/run/c", "3").status());
  const absl::Status got = testing::WaitFor(
      [&] {
        absl::MutexLock l(&mu);
        return !seen.empty() || !ended.ok();
      },
      absl::Seconds(10), "the watch's event");
  absl::MutexLock l(&mu);
  INFO(ended.ToString());
  REQUIRE_OK(got);
  CHECK(seen == std::vector<std::string>{"3"});
}

TEST_CASE("a wrong password or no user gets nothing from it", "[etcd][auth]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = StartAuthEtcd();
  REQUIRE_OK(etcd.status());
  absl::StatusOr<int64_t> wrong =
      Connect(*etcd, kUser, "not-it")->Put("/asyncps/run/x", "1");
  INFO(wrong.status().ToString());
  CHECK_FALSE(wrong.ok());
  CHECK(absl::StrContains(wrong.status().message(), "authenticate as"));
  absl::StatusOr<int64_t> anonymous =
      Connect(*etcd, "", "")->Put("/asyncps/run/x", "1");
  INFO(anonymous.status().ToString());
  CHECK_FALSE(anonymous.ok());
  absl::StatusOr<std::optional<EtcdKeyValue>> x =
      Connect(*etcd, kUser, kPassword)->Get("/asyncps/run/x");
  REQUIRE_OK(x.status());
  CHECK_FALSE(x->has_value());
  // A user without a password is refused before any call.
  EtcdClientOptions o;
  o.endpoints = {etcd->endpoint};
  o.access.user = kUser;
  CHECK(absl::IsInvalidArgument(EtcdClient::Connect(o).status()));
}

}  // namespace
}  // namespace asyncps
