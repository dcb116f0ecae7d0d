// The Prometheus endpoint: RenderPrometheus on hand-built status, the HTTP
// server on its own, and a real ps_server's /metrics agreeing with its
// Status RPC.

#include "server/metrics_http.h"

#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tests/monitoring/shard_rpc.h"
#include "tests/testing/raw_http.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

using testing::ServerProcess;
using testing::ShardRpc;

// A parsed exposition: every sample keyed by "name{labels}" as written.
struct Exposition {
  std::map<std::string, double> samples;
  std::map<std::string, std::string> types;  // family -> type
  std::vector<std::string> errors;           // lines that do not parse
};

// The family a sample belongs to: histogram samples drop their suffix.
std::string FamilyOf(const std::string& name,
                     const std::map<std::string, std::string>& types) {
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    absl::string_view base = name;
    if (absl::ConsumeSuffix(&base, suffix)) {
      auto it = types.find(std::string(base));
      if (it != types.end() && it->second == "histogram") return it->first;
    }
  }
  return name;
}

// Checks text format 0.0.4 line by line: comments are "# HELP name text" or
// "# TYPE name type" (TYPE once, before the family's samples); samples are
// name{label="value",...} value, with the shard label on every one.
Exposition Parse(const std::string& text) {
  static const std::regex kSample(
      R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*")(,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*")*\})? ([-+]?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|Inf|NaN))$)");
  static const std::regex kHelp(R"(^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .*$)");
  static const std::regex kType(
      R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$)");
  Exposition e;
  if (text.empty() || text.back() != '\n') e.errors.push_back("<no final \\n>");
  std::set<std::string> seen_families;
  const std::vector<std::string> lines =
      absl::StrSplit(text, '\n', absl::SkipEmpty());
  for (const std::string& line : lines) {
    std::smatch m;
    if (std::regex_match(line, m, kType)) {
      if (e.types.count(m[1]) || seen_families.count(m[1])) {
        e.errors.push_back("TYPE repeated or after samples: " + line);
      }
      e.types[m[1]] = m[2];
    } else if (std::regex_match(line, m, kHelp)) {
      // fine
    } else if (std::regex_match(line, m, kSample)) {
      const std::string name = m[1];
      const std::string family = FamilyOf(name, e.types);
      seen_families.insert(family);
      if (!e.types.count(family)) e.errors.push_back("no TYPE: " + line);
      if (!absl::StrContains(line, "{shard=\"")) {
        e.errors.push_back("no shard label: " + line);
      }
      const std::string key = line.substr(0, line.rfind(' '));
      const std::string value = m[m.size() - 1];
      double v = 0;
      if (value == "+Inf" || value == "Inf") {
        v = HUGE_VAL;
      } else if (!absl::SimpleAtod(value, &v)) {
        e.errors.push_back("bad value: " + line);
      }
      if (!e.samples.emplace(key, v).second) {
        e.errors.push_back("duplicate series: " + line);
      }
    } else {
      e.errors.push_back("unparsable: " + line);
    }
  }
  return e;
}

double Sample(const Exposition& e, const std::string& key) {
  auto it = e.samples.find(key);
  INFO("series " << key);
  REQUIRE(it != e.samples.end());
  return it->second;
}

StatusResponse HandBuiltStatus() {
  StatusResponse s;
  s.set_shard_index(3);
  s.set_num_shards(4);
  s.set_build_version("1.2\"beta\\x\n");
  s.set_uptime_ms(12345);
  s.mutable_policy()->set_consistency(SSP);
  s.mutable_policy()->set_ssp_slack(2);
  s.mutable_policy()->set_max_staleness(8);
  s.mutable_policy()->set_staleness_lr("inverse");
  s.set_tensors(2);
  s.set_slices(5);
  s.set_parameter_bytes(80);
  Counters* c = s.mutable_counters();
  c->set_pulls(11);
  c->set_pushes(7);
  c->set_duplicate_pushes(1);
  c->set_updates_applied(20);
  c->set_refused_stale(2);
  c->set_scaled(3);
  c->set_rejected_bad_input(4);
  c->set_bytes_in(1000);
  c->set_bytes_out(2000);
  c->set_evictions(1);
  c->set_pull_waits(6);
  c->set_steps(5);
  c->set_misrouted_calls(9);
  c->set_pull_wait_timeouts(1);
  // Buckets [0,1) [1,2) [2,32) [32,inf): counts 5 3 0 2.
  StalenessHistogram* h = s.mutable_staleness();
  for (uint64_t b :
       {uint64_t{1}, uint64_t{2}, uint64_t{32}, uint64_t{INT64_MAX}}) {
    h->add_upper_bounds(b);
  }
  for (uint64_t n : {5, 3, 0, 2}) h->add_counts(n);
  h->set_sum(3 + 100);
  h->set_max(60);
  for (int id : {7, 9}) {
    WorkerStatus* w = s.add_workers();
    w->set_worker_id(id);
    w->set_clock(id == 7 ? 10 : 8);
    w->set_lag(id == 7 ? 0 : 2);
    w->set_live(id == 7);
    w->set_last_heartbeat_age_ms(1500);
    w->set_pushes(id);
    w->set_trained(id == 7 ? 40 : 32);
  }
  s.set_max_parameter_bytes(1 << 20);
  s.set_reserved_parameter_bytes(4096);
  return s;
}

TEST_CASE("RenderPrometheus writes valid text format with every metric",
          "[monitoring][metrics]") {
  const std::string text = RenderPrometheus(HandBuiltStatus());
  INFO(text);
  const Exposition e = Parse(text);
  INFO("errors: " << absl::StrJoin(e.errors, "\n"));
  REQUIRE(e.errors.empty());

  CHECK(Sample(e, R"(asyncps_pulls_total{shard="3"})") == 11);
  CHECK(Sample(e, R"(asyncps_pushes_total{shard="3"})") == 7);
  CHECK(Sample(e, R"(asyncps_duplicate_pushes_total{shard="3"})") == 1);
  CHECK(Sample(e, R"(asyncps_slice_updates_applied_total{shard="3"})") == 20);
  CHECK(Sample(e, R"(asyncps_slice_updates_refused_stale_total{shard="3"})") ==
        2);
  CHECK(Sample(e, R"(asyncps_slice_updates_scaled_total{shard="3"})") == 3);
  CHECK(Sample(e, R"(asyncps_requests_rejected_total{shard="3"})") == 4);
  CHECK(Sample(e, R"(asyncps_bytes_received_total{shard="3"})") == 1000);
  CHECK(Sample(e, R"(asyncps_bytes_sent_total{shard="3"})") == 2000);
  CHECK(Sample(e, R"(asyncps_worker_evictions_total{shard="3"})") == 1);
  CHECK(Sample(e, R"(asyncps_pull_waits_total{shard="3"})") == 6);
  CHECK(Sample(e, R"(asyncps_steps_total{shard="3"})") == 5);
  CHECK(Sample(e, R"(asyncps_misrouted_calls_total{shard="3"})") == 9);
  CHECK(Sample(e, R"(asyncps_uptime_seconds{shard="3"})") == Approx(12.345));
  CHECK(Sample(e, R"(asyncps_parameters_bytes{shard="3"})") == 80);
  CHECK(Sample(e, R"(asyncps_max_parameter_bytes{shard="3"})") == 1 << 20);
  CHECK(Sample(e, R"(asyncps_reserved_parameter_bytes{shard="3"})") == 4096);
  CHECK(Sample(e, R"(asyncps_worker_trained{shard="3",worker="7"})") == 40);
  CHECK(Sample(e, R"(asyncps_tensors{shard="3"})") == 2);
  CHECK(Sample(e, R"(asyncps_slices{shard="3"})") == 5);
  CHECK(Sample(e, R"(asyncps_max_staleness_bound{shard="3"})") == 8);
  CHECK(Sample(e, R"(asyncps_live_workers{shard="3"})") == 1);
  CHECK(e.types.at("asyncps_pushes_total") == "counter");
  CHECK(e.types.at("asyncps_tensors") == "gauge");
  CHECK(e.types.at("asyncps_push_staleness") == "histogram");

  // Integer staleness: [0,1) is le="0", [1,2) le="1", [2,32) le="31".
  CHECK(Sample(e, R"(asyncps_push_staleness_bucket{shard="3",le="0"})") == 5);
  CHECK(Sample(e, R"(asyncps_push_staleness_bucket{shard="3",le="1"})") == 8);
  CHECK(Sample(e, R"(asyncps_push_staleness_bucket{shard="3",le="31"})") == 8);
  CHECK(Sample(e, R"(asyncps_push_staleness_bucket{shard="3",le="+Inf"})") ==
        10);
  CHECK(Sample(e, R"(asyncps_push_staleness_count{shard="3"})") == 10);
  CHECK(Sample(e, R"(asyncps_push_staleness_sum{shard="3"})") == 103);

  CHECK(Sample(e, R"(asyncps_worker_clock{shard="3",worker="7"})") == 10);
  CHECK(Sample(e, R"(asyncps_worker_clock{shard="3",worker="9"})") == 8);
  CHECK(Sample(e, R"(asyncps_worker_lag{shard="3",worker="9"})") == 2);
  CHECK(Sample(e, R"(asyncps_worker_live{shard="3",worker="7"})") == 1);
  CHECK(Sample(e, R"(asyncps_worker_live{shard="3",worker="9"})") == 0);
  CHECK(
      Sample(e,
             R"(asyncps_worker_heartbeat_age_seconds{shard="3",worker="9"})") ==
      Approx(1.5));
  CHECK(Sample(e, R"(asyncps_worker_pushes_total{shard="3",worker="9"})") == 9);

  // Label values escape quote, backslash and newline.
  CHECK(
      Sample(
          e,
          R"(asyncps_build_info{shard="3",version="1.2\"beta\\x\n",consistency="SSP",staleness_lr="inverse"})") ==
      1);
}

TEST_CASE(
    "RenderPrometheus of an idle shard has an empty histogram and no "
    "worker series",
    "[monitoring][metrics]") {
  StatusResponse s;
  s.set_shard_index(0);
  const Exposition e = Parse(RenderPrometheus(s));
  INFO("errors: " << absl::StrJoin(e.errors, "\n"));
  REQUIRE(e.errors.empty());
  CHECK(Sample(e, R"(asyncps_push_staleness_bucket{shard="0",le="+Inf"})") ==
        0);
  CHECK(Sample(e, R"(asyncps_push_staleness_count{shard="0"})") == 0);
  for (const auto& [key, v] : e.samples) {
    CHECK_FALSE(absl::StartsWith(key, "asyncps_worker_clock"));
  }
}

TEST_CASE(
    "RenderPrometheus of a slotted shard names its slots and hottest slot",
    "[monitoring][metrics][slots]") {
  StatusResponse s;
  s.set_shard_index(1);
  ShardMapProto* m = s.mutable_map();
  m->set_epoch(5);
  m->set_num_shards(2);
  m->set_num_slots(4);
  m->set_owners(std::string("\0\0\1\0\1\0\0\0", 8));  // 0 1 1 0
  for (const auto& [slot, bytes] : {std::pair<int, int>{1, 300}, {2, 700}}) {
    SlotLoad* l = s.add_slot_load();
    l->set_slot(slot);
    l->set_updates(3);
    l->set_push_bytes(bytes);
  }
  const Exposition e = Parse(RenderPrometheus(s));
  INFO("errors: " << absl::StrJoin(e.errors, "\n"));
  REQUIRE(e.errors.empty());
  CHECK(Sample(e, R"(asyncps_map_epoch{shard="1"})") == 5);
  CHECK(Sample(e, R"(asyncps_map_slots{shard="1"})") == 4);
  CHECK(Sample(e, R"(asyncps_map_slots_owned{shard="1"})") == 2);
  CHECK(Sample(e, R"(asyncps_slot_push_bytes_max{shard="1"})") == 700);
  CHECK(Sample(e, R"(asyncps_drained{shard="1"})") == 0);
  s.set_drained(true);
  CHECK(Sample(Parse(RenderPrometheus(s)), R"(asyncps_drained{shard="1"})") ==
        1);
}

TEST_CASE("MetricsHttpServer serves /metrics on a free port and stops",
          "[monitoring][metrics]") {
  StatusResponse status = HandBuiltStatus();
  int calls = 0;
  MetricsHttpServer server([&] {
    ++calls;
    return status;
  });
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  REQUIRE(port.ok());
  REQUIRE(*port > 0);
  CHECK(absl::IsFailedPrecondition(server.Start("127.0.0.1", 0).status()));

  // A second server cannot take the same port.
  MetricsHttpServer other([] { return StatusResponse(); });
  CHECK(absl::IsUnavailable(other.Start("127.0.0.1", *port).status()));

  httplib::Client client("127.0.0.1", *port);
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  httplib::Result res = client.Get("/metrics");
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(res->get_header_value("Content-Type") == kPrometheusContentType);
  CHECK(res->body == RenderPrometheus(status));
  CHECK(calls == 1);
  httplib::Result missing = client.Get("/nope");
  REQUIRE(missing);
  CHECK(missing->status == 404);

  server.Stop();
  server.Stop();  // idempotent
  httplib::Client after("127.0.0.1", *port);
  after.set_connection_timeout(2);
  CHECK_FALSE(after.Get("/metrics"));
}

// User + system CPU seconds of process `pid` (/proc/PID/stat, fields 14
// and 15 after the command name; proc(5)), or -1 if unreadable.
double ProcessCpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return -1;
  const std::vector<std::string> f =
      absl::StrSplit(stat.substr(paren + 2), ' ');
  double utime = 0, stime = 0;
  if (f.size() < 13 || !absl::SimpleAtod(f[11], &utime) ||
      !absl::SimpleAtod(f[12], &stime)) {
    return -1;
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

int ReadPortFile(const std::string& path) {
  std::ifstream in(path);
  int port = 0;
  in >> port;
  return port;
}

// A ps_server (shard 0 of 1) with `flags` and its metrics endpoint on a
// free port.
struct MetricsShard {
  ServerProcess server;
  int metrics_port = 0;
};

MetricsShard StartMetricsShard(const std::vector<std::string>& flags) {
  const std::string port_file = testing::UniqueTmpPath("metrics_port");
  std::vector<std::string> args = {
      "--metrics_port=0", absl::StrCat("--metrics_port_file=", port_file)};
  args.insert(args.end(), flags.begin(), flags.end());
  absl::StatusOr<ServerProcess> server = testing::StartPsServer(0, 1, args);
  REQUIRE(server.ok());
  // The metrics port file is written before the gRPC one that StartPsServer
  // waited for.
  MetricsShard m{*std::move(server), ReadPortFile(port_file)};
  REQUIRE(m.metrics_port > 0);
  return m;
}

TEST_CASE("a ps_server's /metrics agrees with its Status RPC",
          "[monitoring][metrics][process]") {
  MetricsShard m = StartMetricsShard({"--max_staleness=0", "--log_level=info"});
  ServerProcess* server = &m.server;
  INFO("server log:\n" << server->process->LogTail());
  const int metrics_port = m.metrics_port;

  ShardRpc rpc(server->address);
  REQUIRE(rpc.Create(testing::ZerosSpec("v", 8, 4)).ok());
  PullResponse pull;
  PushResponse push;
  REQUIRE(rpc.Pull(5, 55, 0, "v", &pull).ok());
  REQUIRE(rpc.Push(5, 55, 0, 1, {{0, 0}, {1, 0}}, "v", 4, &push).ok());
  REQUIRE(rpc.Push(6, 66, 0, 1, {{0, 0}}, "v", 4, &push).ok());  // stale
  REQUIRE(rpc.Push(5, 55, 1, 2, {{0, 1}}, "v", 4, &push).ok());
  REQUIRE(rpc.Push(5, 55, 2, 3, {{0, 9}}, "v", 4, &push).error_code() ==
          grpc::StatusCode::INVALID_ARGUMENT);

  StatusResponse st;
  REQUIRE(rpc.Status(&st).ok());
  httplib::Client client("127.0.0.1", metrics_port);
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  // The process's CPU time as the kernel counts it, just before and after
  // the scrape: the metric lies between (a run this short may still be
  // under one clock tick, so it may be 0).
  const double cpu_before = ProcessCpuSeconds(server->process->pid());
  httplib::Result res = client.Get("/metrics");
  const double cpu_after = ProcessCpuSeconds(server->process->pid());
  REQUIRE(res);
  REQUIRE(res->status == 200);
  INFO(res->body);
  const Exposition e = Parse(res->body);
  INFO("errors: " << absl::StrJoin(e.errors, "\n"));
  REQUIRE(e.errors.empty());

  const Counters& c = st.counters();
  auto total = [&](const std::string& name) {
    return Sample(e, absl::StrCat(name, "{shard=\"0\"}"));
  };
  CHECK(total("asyncps_pulls_total") == c.pulls());
  CHECK(total("asyncps_pushes_total") == c.pushes());
  CHECK(total("asyncps_slice_updates_applied_total") == c.updates_applied());
  CHECK(total("asyncps_slice_updates_refused_stale_total") ==
        c.refused_stale());
  CHECK(total("asyncps_requests_rejected_total") == c.rejected_bad_input());
  CHECK(total("asyncps_bytes_received_total") == c.bytes_in());
  CHECK(total("asyncps_bytes_sent_total") == c.bytes_out());
  CHECK(total("asyncps_parameters_bytes") == st.parameter_bytes());
  CHECK(total("asyncps_tensors") == 1);
  CHECK(total("asyncps_slices") == 2);
  // And those are the scripted numbers.
  CHECK(c.pulls() == 1);
  CHECK(c.pushes() == 3);
  CHECK(c.updates_applied() == 3);
  CHECK(c.refused_stale() == 1);
  CHECK(c.rejected_bad_input() == 1);
  CHECK(total("asyncps_push_staleness_count") == 4);
  CHECK(total("asyncps_push_staleness_sum") == 1);
  CHECK(Sample(e, R"(asyncps_push_staleness_bucket{shard="0",le="0"})") == 3);
  CHECK(Sample(e, R"(asyncps_worker_clock{shard="0",worker="5"})") == 2);
  CHECK(Sample(e, R"(asyncps_worker_clock{shard="0",worker="6"})") == 1);
  CHECK(Sample(e, R"(asyncps_worker_lag{shard="0",worker="6"})") == 1);
  CHECK(Sample(e, R"(asyncps_worker_live{shard="0",worker="5"})") == 1);

  // Per-method call counts and latency, from the server interceptor.
  const std::string push_labels =
      R"(shard="0",grpc_type="unary",grpc_service="asyncps.ParameterServer",)"
      R"(grpc_method="Push")";
  CHECK(Sample(e, "grpc_server_started_total{" + push_labels + "}") == 4);
  CHECK(Sample(e, "grpc_server_handled_total{" + push_labels +
                      R"(,grpc_code="OK"})") == 3);
  CHECK(Sample(e, "grpc_server_handled_total{" + push_labels +
                      R"(,grpc_code="InvalidArgument"})") == 1);
  CHECK(Sample(e, "grpc_server_handling_seconds_count{" + push_labels + "}") ==
        4);
  CHECK(Sample(e, "grpc_server_handling_seconds_bucket{" + push_labels +
                      R"(,le="+Inf"})") == 4);
  CHECK(Sample(e, "grpc_server_handling_seconds_sum{" + push_labels + "}") > 0);
  CHECK(e.types.at("grpc_server_handling_seconds") == "histogram");
  // Process metrics, as Prometheus client libraries name them.
  REQUIRE(cpu_before >= 0);
  CHECK(total("process_cpu_seconds_total") >= cpu_before);
  CHECK(total("process_cpu_seconds_total") <= cpu_after);
  CHECK(total("process_resident_memory_bytes") > 1e6);
  CHECK(total("process_open_fds") > 2);
  CHECK(total("process_max_fds") >= total("process_open_fds"));
  CHECK(std::abs(total("process_start_time_seconds") -
                 static_cast<double>(std::time(nullptr))) < 600);
  CHECK(
      Sample(
          e,
          R"(asyncps_auth_refused_total{shard="0",reason="missing_token"})") ==
      0);

  // SIGTERM stops the endpoint with the shard, cleanly.
  absl::StatusOr<int> code = server->process->Kill(absl::Seconds(10));
  REQUIRE(code.ok());
  CHECK(*code == 0);
  httplib::Client after("127.0.0.1", metrics_port);
  after.set_connection_timeout(2);
  CHECK_FALSE(after.Get("/metrics"));
}

// The HTTP status of GET /metrics at host:port; 0 when nothing answers.
int MetricsStatus(const std::string& host, int port) {
  httplib::Client client(host, port);
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  httplib::Result res = client.Get("/metrics");
  return res ? res->status : 0;
}

TEST_CASE(
    "with the default --host the endpoint answers on IPv4 and, where the "
    "kernel has it, IPv6",
    "[monitoring][metrics][process]") {
  MetricsShard m = StartMetricsShard({"--log_level=info"});
  ServerProcess* server = &m.server;
  INFO("server log:\n" << server->process->LogTail());
  const int metrics_port = m.metrics_port;
  CHECK(MetricsStatus("127.0.0.1", metrics_port) == 200);
  const int probe = socket(AF_INET6, SOCK_STREAM, 0);
  if (probe < 0) {
    WARN("no IPv6 here: the IPv6 half is not checked");
    CHECK(absl::StrContains(server->process->ReadLog(),
                            "Prometheus metrics on http://0.0.0.0:"));
    return;
  }
  close(probe);
  CHECK(absl::StrContains(server->process->ReadLog(),
                          "Prometheus metrics on http://[::]:"));
  CHECK(MetricsStatus("::1", metrics_port) == 200);
}

TEST_CASE(
    "the metrics endpoint reads no large bodies: with Content-Length they "
    "are refused 413 unread, chunked ones 411",
    "[monitoring][metrics][process][bad_input]") {
  MetricsShard m = StartMetricsShard({});
  INFO("server log:\n" << m.server.process->LogTail());
  const int metrics_port = m.metrics_port;
  const pid_t pid = m.server.process->pid();
  absl::StatusOr<testing::ProcessResources> before =
      testing::ReadProcessResources(pid);
  REQUIRE(before.ok());
  // Three callers at once each way, 48 MiB each (httplib's default reads
  // any body whole: such POSTs took a shard to 914 MB for 3 x 400 MB).
  std::vector<int> codes(6, -1);
  std::vector<std::thread> callers;
  for (int i = 0; i < 6; ++i) {
    callers.emplace_back([&, i] {
      testing::RawPost post;
      post.host = "127.0.0.1";
      post.port = metrics_port;
      post.path = "/metrics";
      post.body_bytes = int64_t{48} << 20;
      post.chunked = i % 2 == 1;
      codes[i] = testing::SendRawPost(post);
    });
  }
  for (std::thread& t : callers) t.join();
  absl::StatusOr<testing::ProcessResources> after =
      testing::ReadProcessResources(pid);
  REQUIRE(after.ok());
  INFO("peak RSS " << before->peak_rss_bytes / (1 << 20) << " MiB -> "
                   << after->peak_rss_bytes / (1 << 20) << " MiB");
  for (int i = 0; i < 6; ++i) {
    INFO("caller " << i << (i % 2 == 1 ? " (chunked)" : ""));
    CHECK(codes[i] == (i % 2 == 1 ? 411 : 413));
  }
  CHECK(after->peak_rss_bytes - before->peak_rss_bytes < 24 << 20);
  CHECK(MetricsStatus("127.0.0.1", metrics_port) == 200);
}

TEST_CASE("--metrics_host binds the endpoint to another address than --host",
          "[monitoring][metrics][process]") {
  // gRPC on loopback only, metrics on all interfaces (and the reverse is
  // what operators do; either way the two are independent).
  MetricsShard m = StartMetricsShard(
      {"--host=127.0.0.1", "--metrics_host=0.0.0.0", "--log_level=info"});
  ServerProcess* server = &m.server;
  INFO("server log:\n" << server->process->LogTail());
  CHECK(absl::StrContains(server->process->ReadLog(),
                          "Prometheus metrics on http://0.0.0.0:"));
  const int metrics_port = m.metrics_port;
  CHECK(MetricsStatus("127.0.0.1", metrics_port) == 200);
}

}  // namespace
}  // namespace asyncps

namespace asyncps {
namespace {

TEST_CASE("RenderPrometheus has one series per sparse table",
          "[monitoring][metrics][tables]") {
  StatusResponse s;
  s.set_shard_index(1);
  for (const char* name : {"ctr/emb0", "q\"t"}) {
    TableStatus* t = s.add_tables();
    t->set_name(name);
    t->set_dim(16);
    t->set_rows(name[0] == 'c' ? 1000 : 5);
    t->set_bytes(128000);
    t->set_rows_created(1200);
    t->set_rows_evicted(200);
    t->set_pulls(30);
    t->set_pushes(29);
    t->set_rows_pulled(60000);
    t->set_rows_pushed(58000);
  }
  const Exposition e = Parse(RenderPrometheus(s));
  INFO("errors: " << absl::StrJoin(e.errors, "\n"));
  REQUIRE(e.errors.empty());
  CHECK(Sample(e, R"(asyncps_table_rows{shard="1",table="ctr/emb0"})") == 1000);
  CHECK(Sample(e, R"(asyncps_table_rows{shard="1",table="q\"t"})") == 5);
  CHECK(Sample(e, R"(asyncps_table_bytes{shard="1",table="ctr/emb0"})") ==
        128000);
  CHECK(
      Sample(
          e,
          R"(asyncps_table_rows_created_total{shard="1",table="ctr/emb0"})") ==
      1200);
  CHECK(
      Sample(
          e,
          R"(asyncps_table_rows_evicted_total{shard="1",table="ctr/emb0"})") ==
      200);
  CHECK(Sample(e, R"(asyncps_table_pulls_total{shard="1",table="ctr/emb0"})") ==
        30);
  CHECK(
      Sample(e, R"(asyncps_table_pushes_total{shard="1",table="ctr/emb0"})") ==
      29);
  CHECK(Sample(
            e,
            R"(asyncps_table_rows_pulled_total{shard="1",table="ctr/emb0"})") ==
        60000);
  CHECK(e.types.at("asyncps_table_rows") == "gauge");
  CHECK(e.types.at("asyncps_table_pushes_total") == "counter");
}

}  // namespace
}  // namespace asyncps
