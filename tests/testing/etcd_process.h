#ifndef ASYNCPS_TESTS_TESTING_ETCD_PROCESS_H_
#define ASYNCPS_TESTS_TESTING_ETCD_PROCESS_H_

// A real etcd server (Debian's etcd-server, /usr/bin/etcd) for tests: one
// member on free loopback ports, its data in a fresh directory, killed by
// PID when the EtcdProcess goes.
//
// Example:
//
//   absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
//   REQUIRE_OK(etcd.status());
//   EtcdClientOptions o;
//   o.endpoints = {etcd->endpoint};      // "127.0.0.1:<port>"
//   ...
//   REQUIRE_OK(testing::RestartEtcd(&*etcd));  // same ports and data

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/security.h"
#include "membership/etcd_client.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace testing {

// TLS on etcd's client port: its certificate and key, and with `ca` the
// client certificates it requires (--client-cert-auth) are checked with it;
// the client certificate and key its clients in a test present.
struct EtcdTls {
  std::string cert, key, ca;
  std::string client_cert, client_key;
};

struct EtcdProcess {
  // Removes the folder of data_dir (etcd's write-ahead log alone takes 64
  // MB) and log once the process is gone: declared first, so destroyed
  // last.
  OwnedTmpDir folder_owner;
  std::unique_ptr<Subprocess> process;
  std::string endpoint;  // client address, "127.0.0.1:<port>"
  std::string peer;      // peer address
  std::string data_dir;  // <its folder>/data
  std::string log;       // <its folder>/etcd.log: the process's output
  std::vector<std::string> extra_args;  // given at every start
  EtcdTls tls;                          // none: plain TCP
  // Set by EtcdEnableAuth: the user its clients in a test are, and the
  // file holding its password.
  std::string user, password, password_file;
  // Where /health and /metrics answer in plain HTTP: the endpoint, or
  // with TLS a metrics address of its own.
  std::string http;
};

// The etcd binary (ASYNCPS_ETCD if set, else /usr/bin/etcd).
std::string EtcdBinary();

// True (after printing one "ASYNCPS_SKIPPED: ..." line, which tests/run.sh
// counts as skipped) when there is no etcd binary to run: a test that needs
// etcd returns at once then, and never passes without it.
bool SkipWithoutEtcd();

// Starts etcd on free loopback ports with a new data directory (and
// `extra_args`, e.g. "--quota-backend-bytes=N"; serving TLS with `tls`)
// and waits up to `timeout` until it reports itself healthy (it has a
// leader).
absl::StatusOr<EtcdProcess> StartEtcd(
    absl::Duration timeout = absl::Seconds(30),
    std::vector<std::string> extra_args = {}, EtcdTls tls = {});

// How a client of `etcd` reaches it (EtcdClientOptions::access): plain
// TCP, or its CA and the test's client certificate; as its user once
// EtcdEnableAuth ran.
EtcdAccess EtcdClientAccess(const EtcdProcess& etcd);

// The same as the flags of a program (--etcd_ca, --etcd_cert, --etcd_key;
// none for plain TCP).
std::vector<std::string> EtcdClientFlags(const EtcdProcess& etcd);

// Turns etcd's authentication on (plain TCP only), as an operator does:
// a root user, and `user` with `password` allowed to read and write keys
// under `prefix` and nothing else; the clients of EtcdClientAccess and
// EtcdClientFlags are `user` from then on.
absl::Status EtcdEnableAuth(EtcdProcess* etcd, const std::string& user,
                            const std::string& password,
                            const std::string& prefix);

// What an operator does once etcd's database is full (its NOSPACE alarm,
// past --quota-backend-bytes): deletes every key under "/junk/" (what a
// test filled it with), compacts its history, defragments it and disarms
// the alarm, through etcd's JSON gateway (plain TCP only).
absl::Status EtcdFreeSpace(const EtcdProcess& etcd);

// Starts a cluster of `members` etcd processes on free loopback ports and
// waits until every member is healthy (RestartEtcd restarts StartEtcd's
// lone members only).
absl::StatusOr<std::vector<EtcdProcess>> StartEtcdCluster(
    int members, absl::Duration timeout = absl::Seconds(30));

// Whether `etcd` is its cluster's leader now (its /metrics'
// etcd_server_is_leader).
absl::StatusOr<bool> EtcdIsLeader(const EtcdProcess& etcd);

// How many calls of gRPC method `method` (e.g. "LeaseKeepAlive"; a stream
// counts once) etcd has started, from its /metrics.
absl::StatusOr<int64_t> EtcdCallsStarted(const EtcdProcess& etcd,
                                         absl::string_view method);

// Kills the process (SIGKILL), waits `down`, and starts it again on the
// same ports, healthy again: on the same data directory, or with `wipe` on
// a new, empty one (etcd lost its data: every key and lease is gone).
absl::Status RestartEtcd(EtcdProcess* etcd,
                         absl::Duration timeout = absl::Seconds(30),
                         absl::Duration down = absl::ZeroDuration(),
                         bool wipe = false);

}  // namespace testing
}  // namespace asyncps

#endif  // ASYNCPS_TESTS_TESTING_ETCD_PROCESS_H_
