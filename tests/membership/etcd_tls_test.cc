// The etcd client over TLS (EtcdClientOptions::security) against a real
// etcd that serves TLS and requires client certificates signed by its CA
// (--client-cert-auth): with the CA and a client certificate every kind of
// call works (keys, leases, watches); without TLS, without a client
// certificate, or with one another CA signed, nothing does.
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "membership/etcd_client.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/test_pki.h"

namespace asyncps {
namespace {

absl::StatusOr<testing::EtcdProcess> StartTlsEtcd() {
  const testing::Pki& pki = testing::TestPki();
  return testing::StartEtcd(absl::Seconds(30), {},
                            {pki.server_cert, pki.server_key, pki.ca,
                             pki.client_cert, pki.client_key});
}

std::unique_ptr<EtcdClient> Connect(
    const testing::EtcdProcess& etcd, const SecurityOptions& security,
    absl::Duration call_timeout = absl::Seconds(5)) {
  EtcdClientOptions o;
  o.endpoints = {etcd.endpoint};
  o.access.tls = security;
  o.call_timeout = call_timeout;
  absl::StatusOr<std::unique_ptr<EtcdClient>> c = EtcdClient::Connect(o);
  REQUIRE_OK(c.status());
  return *std::move(c);
}

TEST_CASE("with etcd's CA and a client certificate every call works",
          "[etcd][tls]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = StartTlsEtcd();
  REQUIRE_OK(etcd.status());
  std::unique_ptr<EtcdClient> c =
      Connect(*etcd, testing::EtcdClientAccess(*etcd).tls);

  absl::Mutex mu;
  std::vector<std::string> seen;
  std::unique_ptr<EtcdClient::Watcher> w = c->WatchPrefix(
      "/run/", 0,
      [&](const std::vector<EtcdEvent>& events, int64_t) {
        absl::MutexLock l(&mu);
        for (const EtcdEvent& e : events) seen.push_back(e.kv.value);
      },
      [](const absl::Status&) {});
  absl::SleepFor(absl::Milliseconds(200));  // the watch starts
  absl::StatusOr<int64_t> lease = c->GrantLease(absl::Seconds(5));
  REQUIRE_OK(lease.status());
  REQUIRE_OK(c->Put("/run/a", "1", *lease).status());
  absl::StatusOr<std::optional<EtcdKeyValue>> a = c->Get("/run/a");
  REQUIRE_OK(a.status());
  REQUIRE(a->has_value());
  CHECK((*a)->value == "1");
  CHECK((*a)->lease == *lease);
  REQUIRE_OK(testing::WaitFor(
      [&] {
        absl::MutexLock l(&mu);
        return !seen.empty();
      },
      absl::Seconds(10), "the watch's event"));
  absl::MutexLock l(&mu);
  CHECK(seen == std::vector<std::string>{"1"});
}

TEST_CASE(
    "without TLS, without a client certificate, or with another CA's, etcd "
    "answers nothing",
    "[etcd][tls]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = StartTlsEtcd();
  REQUIRE_OK(etcd.status());
  const testing::Pki& pki = testing::TestPki();
  SecurityOptions ca_only;
  ca_only.tls_ca = pki.ca;
  SecurityOptions rogue = ca_only;
  rogue.tls_cert = pki.rogue_cert;
  rogue.tls_key = pki.rogue_key;
  SecurityOptions unverified;  // a client certificate, etcd's not checked
  unverified.tls_cert = pki.client_cert;
  unverified.tls_key = pki.client_key;
  struct Case {
    const char* what;
    SecurityOptions security;
  };
  for (const Case& k :
       {Case{"plain TCP", SecurityOptions()},
        Case{"no client certificate", ca_only},
        Case{"another CA's certificate", rogue},
        Case{"etcd's certificate not checked (system roots)", unverified}}) {
    INFO(k.what);
    std::unique_ptr<EtcdClient> c =
        Connect(*etcd, k.security, absl::Seconds(1));
    const absl::Time start = absl::Now();
    absl::StatusOr<int64_t> put = c->Put("/run/x", "1");
    INFO(put.status().ToString());
    CHECK_FALSE(put.ok());
    CHECK(absl::Now() - start < absl::Seconds(5));
  }
  // Nothing was written.
  absl::StatusOr<std::optional<EtcdKeyValue>> x =
      Connect(*etcd, testing::EtcdClientAccess(*etcd).tls)->Get("/run/x");
  REQUIRE_OK(x.status());
  CHECK_FALSE(x->has_value());
}

TEST_CASE("TLS options that cannot work are refused at Connect",
          "[etcd][tls]") {
  const testing::Pki& pki = testing::TestPki();
  EtcdClientOptions o;
  o.endpoints = {"127.0.0.1:1"};
  o.access.tls.tls_cert = pki.client_cert;  // no key
  CHECK(absl::IsInvalidArgument(EtcdClient::Connect(o).status()));
  o.access.tls.tls_key = pki.client_key;
  o.access.tls.tls_ca = pki.dir + "/no-such-ca.pem";
  CHECK(absl::IsInvalidArgument(EtcdClient::Connect(o).status()));
  o.access.tls.tls_ca = pki.ca;
  o.access.tls.cluster_token = "t";
  CHECK(absl::IsInvalidArgument(EtcdClient::Connect(o).status()));
  o.access.tls.cluster_token.clear();
  CHECK(EtcdClient::Connect(o).ok());
}

}  // namespace
}  // namespace asyncps
