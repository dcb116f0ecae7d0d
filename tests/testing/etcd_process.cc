#include "tests/testing/etcd_process.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace asyncps {
namespace testing {
namespace {

// The whole answer (head and body) to "GET <path>", or to "POST <path>"
// with `body` when it is not empty, from etcd at "127.0.0.1:<port>"; empty
// when it did not answer within `timeout_s` seconds.
std::string HttpCall(const std::string& address, const std::string& path,
                     const std::string& body = "", int timeout_s = 1) {
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port)) {
    return "";
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  const timeval timeout{timeout_s, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string answer;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request =
        body.empty()
            ? absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            : absl::StrCat("POST ", path,
                           " HTTP/1.0\r\nHost: 127.0.0.1\r\n"
                           "Content-Type: application/json\r\n"
                           "Content-Length: ",
                           body.size(), "\r\n\r\n", body);
    if (write(fd, request.data(), request.size()) ==
        static_cast<ssize_t>(request.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) answer.append(buf, n);
    }
  }
  close(fd);
  return answer;
}

std::string HttpGet(const std::string& address, const std::string& path) {
  return HttpCall(address, path);
}

// Whether etcd at "127.0.0.1:<port>" serves requests: its /health answer
// says so once it has a leader (a request before that may time out).
bool Healthy(const std::string& address) {
  return HttpGet(address, "/health").find("\"health\":\"true\"") !=
         std::string::npos;
}

// Starts `etcd`'s process, as member `name` of `initial_cluster`.
absl::Status Spawn(EtcdProcess* etcd, const std::string& name,
                   const std::string& initial_cluster) {
  const bool tls = !etcd->tls.cert.empty();
  const std::string client =
      absl::StrCat(tls ? "https://" : "http://", etcd->endpoint);
  const std::string peer = absl::StrCat("http://", etcd->peer);
  std::vector<std::string> args = {
      "--name=" + name,
      "--data-dir=" + etcd->data_dir,
      "--listen-client-urls=" + client,
      "--advertise-client-urls=" + client,
      "--listen-peer-urls=" + peer,
      "--initial-advertise-peer-urls=" + peer,
      "--initial-cluster=" + initial_cluster,
      "--log-level=warn",
      // On loopback: elections in 0.5 s let etcd grant 1 s leases (its
      // shortest lease is 1.5 election timeouts), which is what bounds a
      // failover (ps_server --lease_ms=1000).
      "--heartbeat-interval=50",
      "--election-timeout=500",
  };
  if (tls) {
    args.push_back("--cert-file=" + etcd->tls.cert);
    args.push_back("--key-file=" + etcd->tls.key);
    if (!etcd->tls.ca.empty()) {
      args.push_back("--trusted-ca-file=" + etcd->tls.ca);
      args.push_back("--client-cert-auth");
    }
    // /health and /metrics in plain HTTP for the helpers here.
    args.push_back("--listen-metrics-urls=http://" + etcd->http);
  }
  args.insert(args.end(), etcd->extra_args.begin(), etcd->extra_args.end());
  absl::StatusOr<std::unique_ptr<Subprocess>> p =
      Subprocess::Start(EtcdBinary(), args, etcd->log);
  if (!p.ok()) return p.status();
  etcd->process = *std::move(p);
  return absl::OkStatus();
}

// Until `etcd` reports itself healthy (it has a leader).
absl::Status AwaitHealthy(EtcdProcess* etcd, absl::Duration timeout) {
  Subprocess* process = etcd->process.get();
  const absl::Status up =
      WaitFor([&] { return !process->Running() || Healthy(etcd->http); },
              timeout, "etcd to be healthy", absl::Milliseconds(100));
  if (!up.ok() || !process->Running()) {
    return absl::UnavailableError(absl::StrCat(
        "etcd did not start: ", up.message(), "\n", process->LogTail()));
  }
  return absl::OkStatus();
}

absl::Status Launch(EtcdProcess* etcd, absl::Duration timeout) {
  absl::Status s = Spawn(etcd, "asyncps-test",
                         absl::StrCat("asyncps-test=http://", etcd->peer));
  if (!s.ok()) return s;
  return AwaitHealthy(etcd, timeout);
}

// A new, empty folder for `etcd`'s data and log (the old one goes).
void NewFolder(EtcdProcess* etcd) {
  const std::string folder = MakeTmpDir("etcd");
  etcd->folder_owner = OwnedTmpDir(folder);
  etcd->data_dir = folder + "/data";
  etcd->log = folder + "/etcd.log";
}

// A member's addresses and folder, its process not started.
absl::StatusOr<EtcdProcess> Prepare() {
  EtcdProcess etcd;
  absl::StatusOr<std::string> client = UnusedLoopbackAddress();
  if (!client.ok()) return client.status();
  absl::StatusOr<std::string> peer = UnusedLoopbackAddress();
  if (!peer.ok()) return peer.status();
  etcd.endpoint = *client;
  etcd.http = *client;
  etcd.peer = *peer;
  NewFolder(&etcd);
  return etcd;
}

}  // namespace

absl::StatusOr<int64_t> EtcdCallsStarted(const EtcdProcess& etcd,
                                         absl::string_view method) {
  const std::string metrics = HttpGet(etcd.http, "/metrics");
  // grpc_server_started_total{grpc_method="Range",grpc_service=...} 12
  const std::string name =
      absl::StrCat("grpc_server_started_total{grpc_method=\"", method, "\"");
  for (absl::string_view line : absl::StrSplit(metrics, '\n')) {
    if (!absl::StartsWith(line, name)) continue;
    double n = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &n)) {
      return static_cast<int64_t>(n);
    }
  }
  if (metrics.find("grpc_server_started_total") == std::string::npos) {
    return absl::UnavailableError(
        absl::StrCat("etcd at ", etcd.endpoint, " served no gRPC metrics"));
  }
  return 0;  // no call of `method` yet
}

absl::StatusOr<bool> EtcdIsLeader(const EtcdProcess& etcd) {
  const std::string metrics = HttpGet(etcd.http, "/metrics");
  for (absl::string_view line : absl::StrSplit(metrics, '\n')) {
    if (absl::StartsWith(line, "etcd_server_is_leader ")) {
      return absl::EndsWith(line, " 1");
    }
  }
  return absl::UnavailableError(
      absl::StrCat("etcd at ", etcd.endpoint, " served no leader metric"));
}

EtcdAccess EtcdClientAccess(const EtcdProcess& etcd) {
  EtcdAccess a;
  a.user = etcd.user;
  a.password = etcd.password;
  if (etcd.tls.cert.empty()) return a;
  a.tls.tls_ca = etcd.tls.ca;
  a.tls.tls_cert = etcd.tls.client_cert;
  a.tls.tls_key = etcd.tls.client_key;
  return a;
}

std::vector<std::string> EtcdClientFlags(const EtcdProcess& etcd) {
  const SecurityOptions s = EtcdClientAccess(etcd).tls;
  std::vector<std::string> flags;
  if (!s.tls_ca.empty()) flags.push_back("--etcd_ca=" + s.tls_ca);
  if (!s.tls_cert.empty()) {
    flags.push_back("--etcd_cert=" + s.tls_cert);
    flags.push_back("--etcd_key=" + s.tls_key);
  }
  if (!etcd.user.empty()) {
    flags.push_back("--etcd_user=" + etcd.user);
    flags.push_back("--etcd_password_file=" + etcd.password_file);
  }
  return flags;
}

absl::Status EtcdEnableAuth(EtcdProcess* etcd, const std::string& user,
                            const std::string& password,
                            const std::string& prefix) {
  const auto json = [](const std::string& s) {
    return absl::StrCat("\"", s, "\"");  // names and base64: nothing to escape
  };
  const std::string steps[][2] = {
      {"/v3/auth/user/add",
       absl::StrCat("{\"name\":\"root\",\"password\":", json(password), "}")},
      {"/v3/auth/role/add", "{\"name\":\"root\"}"},
      {"/v3/auth/user/grant", "{\"user\":\"root\",\"role\":\"root\"}"},
      {"/v3/auth/user/add",
       absl::StrCat("{\"name\":", json(user), ",\"password\":", json(password),
                    "}")},
      {"/v3/auth/role/add", "{\"name\":\"asyncps\"}"},
      {"/v3/auth/role/grant",
       absl::StrCat("{\"name\":\"asyncps\",\"perm\":{\"permType\":"
                    "\"READWRITE\",\"key\":",
                    json(absl::Base64Escape(prefix)), ",\"range_end\":",
                    json(absl::Base64Escape(EtcdClient::PrefixEnd(prefix))),
                    "}}")},
      {"/v3/auth/user/grant",
       absl::StrCat("{\"user\":", json(user), ",\"role\":\"asyncps\"}")},
      {"/v3/auth/enable", "{}"},
  };
  for (const auto& step : steps) {
    const std::string answer = HttpCall(etcd->endpoint, step[0], step[1], 10);
    if (!absl::StrContains(answer.substr(0, answer.find('\r')), " 200")) {
      return absl::InternalError(
          absl::StrCat("etcd's ", step[0], " answered: ", answer));
    }
  }
  etcd->user = user;
  etcd->password = password;
  etcd->password_file =
      etcd->data_dir.substr(0, etcd->data_dir.rfind('/')) + "/password";
  FILE* f = std::fopen(etcd->password_file.c_str(), "w");
  if (f == nullptr) return absl::InternalError("cannot write the password");
  std::fputs(password.c_str(), f);
  std::fclose(f);
  chmod(etcd->password_file.c_str(), 0600);
  return absl::OkStatus();
}

absl::Status EtcdFreeSpace(const EtcdProcess& etcd) {
  // etcd's JSON gateway: keys and values in base64.
  const std::string junk = absl::Base64Escape("/junk/");
  const std::string junk_end = absl::Base64Escape("/junk0");
  std::string answer = HttpCall(
      etcd.endpoint, "/v3/kv/deleterange",
      absl::StrCat("{\"key\":\"", junk, "\",\"range_end\":\"", junk_end, "\"}"),
      10);
  // "header":{"cluster_id":"...","member_id":"...","revision":"...",...}
  std::smatch member, revision;
  if (!std::regex_search(answer, member,
                         std::regex("\"member_id\":\"([0-9]+)\"")) ||
      !std::regex_search(answer, revision,
                         std::regex("\"revision\":\"([0-9]+)\""))) {
    return absl::InternalError(
        absl::StrCat("etcd's deleterange answered: ", answer));
  }
  const std::string steps[][2] = {
      {"/v3/kv/compaction", absl::StrCat("{\"revision\":\"", revision[1].str(),
                                         "\",\"physical\":true}")},
      {"/v3/maintenance/defragment", "{}"},
      {"/v3/maintenance/alarm",
       absl::StrCat("{\"action\":\"DEACTIVATE\",\"memberID\":\"",
                    member[1].str(), "\",\"alarm\":\"NOSPACE\"}")},
  };
  for (const auto& step : steps) {
    answer = HttpCall(etcd.endpoint, step[0], step[1], 10);
    if (!absl::StrContains(answer.substr(0, answer.find('\r')), " 200")) {
      return absl::InternalError(
          absl::StrCat("etcd's ", step[0], " answered: ", answer));
    }
  }
  return absl::OkStatus();
}

std::string EtcdBinary() {
  const char* env = std::getenv("ASYNCPS_ETCD");
  return env != nullptr && *env != '\0' ? env : "/usr/bin/etcd";
}

bool SkipWithoutEtcd() {
  const std::string binary = EtcdBinary();
  if (access(binary.c_str(), X_OK) == 0) return false;
  static bool said = false;
  if (!said) {
    std::printf(
        "ASYNCPS_SKIPPED: no etcd at %s (deploy/install_deps.sh installs "
        "etcd-server)\n",
        binary.c_str());
    std::fflush(stdout);
    said = true;
  }
  return true;
}

absl::StatusOr<EtcdProcess> StartEtcd(absl::Duration timeout,
                                      std::vector<std::string> extra_args,
                                      EtcdTls tls) {
  absl::StatusOr<EtcdProcess> etcd = Prepare();
  if (!etcd.ok()) return etcd.status();
  etcd->extra_args = std::move(extra_args);
  if (!tls.cert.empty()) {
    etcd->tls = std::move(tls);
    absl::StatusOr<std::string> http = UnusedLoopbackAddress();
    if (!http.ok()) return http.status();
    etcd->http = *http;
  }
  absl::Status s = Launch(&*etcd, timeout);
  if (!s.ok()) return s;
  return etcd;
}

absl::StatusOr<std::vector<EtcdProcess>> StartEtcdCluster(
    int members, absl::Duration timeout) {
  std::vector<EtcdProcess> cluster;
  std::vector<std::string> peers;
  for (int i = 0; i < members; ++i) {
    absl::StatusOr<EtcdProcess> m = Prepare();
    if (!m.ok()) return m.status();
    peers.push_back(absl::StrCat("m", i, "=http://", m->peer));
    cluster.push_back(*std::move(m));
  }
  const std::string initial = absl::StrJoin(peers, ",");
  for (int i = 0; i < members; ++i) {
    absl::Status s = Spawn(&cluster[i], absl::StrCat("m", i), initial);
    if (!s.ok()) return s;
  }
  for (EtcdProcess& m : cluster) {
    absl::Status s = AwaitHealthy(&m, timeout);
    if (!s.ok()) return s;
  }
  return cluster;
}

absl::Status RestartEtcd(EtcdProcess* etcd, absl::Duration timeout,
                         absl::Duration down, bool wipe) {
  if (etcd->process != nullptr) {
    absl::StatusOr<int> killed = etcd->process->Kill(absl::ZeroDuration());
    if (!killed.ok()) return killed.status();
  }
  if (wipe) NewFolder(etcd);
  absl::SleepFor(down);
  return Launch(etcd, timeout);
}

}  // namespace testing
}  // namespace asyncps
