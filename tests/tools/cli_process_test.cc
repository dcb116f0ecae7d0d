// The three binaries' command lines as operators meet them: --help,
// --version, exit 2 on bad flags, ASYNCPS_<FLAG> environment variables (the
// command line wins), and the identity a Kubernetes pod gives them
// (StatefulSet host name, Indexed Job JOB_COMPLETION_INDEX), and the
// clients' --etcd_endpoints (the shards from a replicated run's map).

#include <catch2/catch.hpp>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "membership/etcd_client.h"
#include "membership/map_store.h"
#include "tests/monitoring/shard_rpc.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/shard_maps.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

using testing::ShardRpc;
using testing::Subprocess;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Run {
  int code = -1;
  std::string out;
  std::string err;
};

// Runs `binary` (a runfile path) with `args` under the environment
// assignments `env` ("NAME=value", added to the test's environment).
Run RunBinary(const std::string& binary, const std::vector<std::string>& args,
              const std::vector<std::string>& env = {}) {
  const std::string out = testing::UniqueTmpPath("out");
  const std::string err = testing::UniqueTmpPath("err");
  std::string cmd = "exec env";
  for (const std::string& e : env) absl::StrAppend(&cmd, " '", e, "'");
  absl::StrAppend(&cmd, " '", testing::RunfilePath(binary), "'");
  for (const std::string& a : args) absl::StrAppend(&cmd, " '", a, "'");
  absl::StrAppend(&cmd, " >'", out, "' 2>'", err, "'");
  absl::StatusOr<std::unique_ptr<Subprocess>> p =
      Subprocess::Start("/bin/sh", {"-c", cmd});
  REQUIRE(p.ok());
  absl::StatusOr<int> code = (*p)->Wait(absl::Seconds(120));
  INFO(cmd);
  REQUIRE(code.ok());
  return Run{*code, ReadFile(out), ReadFile(err)};
}

const char* const kBinaries[] = {"server/ps_server", "worker/ps_worker",
                                 "tools/psctl"};

TEST_CASE("--help lists the binary's own flags with defaults and exits 0",
          "[cli][process]") {
  struct Expect {
    std::string binary;
    std::vector<std::string> lines;
  };
  const std::vector<Expect> expected = {
      {"server/ps_server",
       {"--port=0\n", "--shard_index=\"0\"\n", "--consistency=\"asp\"\n",
        "--metrics_host=\"\"\n", "--health_port=-1\n",
        "--advertise_address=\"\"\n"}},
      {"worker/ps_worker",
       {"--servers=\"\"\n", "--worker_id=\"0\"\n", "--batch_size=64\n"}},
      {"tools/psctl",
       {"--servers=\"\"\n", "--output=\"table\"\n", "--timeout=3s\n"}},
  };
  for (const Expect& e : expected) {
    const Run run = RunBinary(e.binary, {"--help"});
    INFO(e.binary << "\n" << run.out << run.err);
    CHECK(run.code == 0);
    CHECK_FALSE(absl::StrContains(run.out, "No flags matched"));
    for (const std::string& line : e.lines) {
      CHECK(absl::StrContains(run.out, "  " + line));
    }
    // The shared security flags, once, in every binary's help.
    for (const char* flag :
         {"--tls_cert=", "--tls_key=", "--tls_ca=",
          "--tls_require_client_cert=", "--cluster_token_file="}) {
      CHECK(absl::StrContains(run.out, flag));
    }
    CHECK(absl::StrContains(run.out, "ASYNCPS_<FLAG>"));
    // No absl internals.
    CHECK_FALSE(absl::StrContains(run.out, "--flagfile"));
  }
}

TEST_CASE("--version on every binary", "[cli][process]") {
  for (const char* binary : kBinaries) {
    const Run run = RunBinary(binary, {"--version"});
    const std::string name =
        std::string(binary).substr(std::string(binary).find('/') + 1);
    INFO(binary << ": " << run.out << run.err);
    CHECK(run.code == 0);
    CHECK(absl::StartsWith(run.out, name + " "));
  }
}

TEST_CASE("psctl output that cannot be written exits 1 saying so",
          "[cli][process]") {
  // /dev/full: every write fails with ENOSPC, as onto a full disk under
  // `psctl ... > file`.
  const std::string err = testing::UniqueTmpPath("err");
  for (const char* args : {"--help", "status --servers=127.0.0.1:1 -o json"}) {
    const std::string cmd =
        absl::StrCat("exec '", testing::RunfilePath("tools/psctl"), "' ", args,
                     " >/dev/full 2>'", err, "'");
    absl::StatusOr<std::unique_ptr<Subprocess>> p =
        Subprocess::Start("/bin/sh", {"-c", cmd});
    REQUIRE(p.ok());
    absl::StatusOr<int> code = (*p)->Wait(absl::Seconds(60));
    REQUIRE(code.ok());
    const std::string said = ReadFile(err);
    INFO(cmd << ": " << said);
    CHECK(*code == 1);  // status: also 1, the shard being down
    CHECK(absl::StrContains(said, "psctl: cannot write the output"));
  }
}

TEST_CASE("unknown and mistyped flags exit 2 naming the flag",
          "[cli][process]") {
  for (const char* binary : kBinaries) {
    const Run unknown = RunBinary(binary, {"--frobnicate=1"});
    INFO(binary << ": " << unknown.err);
    CHECK(unknown.code == 2);
    CHECK(absl::StrContains(unknown.err, "unknown flag --frobnicate"));
    const Run typo = RunBinary(binary, {"--log_levle=debug"});
    INFO(typo.err);
    CHECK(typo.code == 2);
    const Run bad = RunBinary(binary, {"--tls_require_client_cert=maybe"});
    INFO(bad.err);
    CHECK(bad.code == 2);
    CHECK(absl::StrContains(bad.err, "--tls_require_client_cert"));
  }
  // A reshard-only flag: an error on the command line of another command,
  // a warning when it comes from the environment (ASYNCPS_SHARDS is also
  // the Slurm script's setting).
  const Run shards_flag = RunBinary("tools/psctl", {"health", "--shards=3"});
  CHECK(shards_flag.code == 2);
  CHECK(absl::StrContains(shards_flag.err,
                          "--shards applies only to the reshard or scale "
                          "command"));
  const Run shards_env = RunBinary(
      "tools/psctl", {"health", "--servers=127.0.0.1:1", "--timeout=1s"},
      {"ASYNCPS_SHARDS=3"});
  INFO(shards_env.err);
  CHECK(shards_env.code != 2);
  CHECK(absl::StrContains(shards_env.err, "ASYNCPS_SHARDS sets --shards"));
  // Durations that would never end a wait.
  for (const char* flag : {"--watch=inf", "--timeout=inf"}) {
    const Run endless =
        RunBinary("tools/psctl", {"status", "--servers=127.0.0.1:1", flag});
    INFO(flag << ": " << endless.err);
    CHECK(endless.code == 2);
    CHECK(absl::StrContains(endless.err, "and finite, got inf"));
  }
  const Run typo = RunBinary("server/ps_server", {"--shard_idx=1"});
  CHECK(absl::StrContains(typo.err, "did you mean --shard_index?"));
  const Run stray = RunBinary("server/ps_server", {"extra"});
  CHECK(stray.code == 2);
  CHECK(absl::StrContains(stray.err, "'extra'"));
}

// Starts ps_server with `env` and `args` and waits for its port.
struct Shard {
  std::unique_ptr<Subprocess> process;
  std::string address;
};

Shard StartShard(const std::vector<std::string>& env,
                 const std::vector<std::string>& args) {
  const std::string port_file = testing::UniqueTmpPath("port");
  std::string cmd = "exec env";
  for (const std::string& e : env) absl::StrAppend(&cmd, " '", e, "'");
  absl::StrAppend(&cmd, " '", testing::RunfilePath("server/ps_server"),
                  "' --port=0 --host=127.0.0.1 --port_file=", port_file);
  for (const std::string& a : args) absl::StrAppend(&cmd, " '", a, "'");
  absl::StatusOr<std::unique_ptr<Subprocess>> p =
      Subprocess::Start("/bin/sh", {"-c", cmd});
  REQUIRE(p.ok());
  Shard s;
  s.process = *std::move(p);
  int port = 0;
  INFO(cmd);
  REQUIRE(testing::WaitFor(
              [&] {
                const std::string text = ReadFile(port_file);
                return text.find('\n') != std::string::npos &&
                       absl::SimpleAtoi(absl::StripAsciiWhitespace(text),
                                        &port);
              },
              absl::Seconds(30), "port file")
              .ok());
  s.address = absl::StrCat("127.0.0.1:", port);
  return s;
}

TEST_CASE("ASYNCPS_<FLAG> variables configure ps_server; flags win",
          "[cli][process]") {
  Shard shard = StartShard({"ASYNCPS_NUM_SHARDS=3", "ASYNCPS_SHARD_INDEX=2",
                            "ASYNCPS_CONSISTENCY=ssp", "ASYNCPS_SSP_SLACK=5",
                            "ASYNCPS_ADVERTISE_ADDRESS=ps-2.example:7000"},
                           {"--ssp_slack=4"});
  INFO(shard.process->LogTail());
  StatusResponse st;
  REQUIRE(ShardRpc(shard.address).Status(&st).ok());
  CHECK(st.shard_index() == 2);
  CHECK(st.num_shards() == 3);
  CHECK(st.policy().consistency() == SSP);
  CHECK(st.policy().ssp_slack() == 4);  // the flag, not the variable
  CHECK(st.address() == "ps-2.example:7000");
  CHECK(absl::StrContains(shard.process->ReadLog(),
                          "advertised as ps-2.example:7000"));

  const Run bad = RunBinary("server/ps_server", {}, {"ASYNCPS_PORT=seventy"});
  INFO(bad.err);
  CHECK(bad.code == 2);
  CHECK(absl::StrContains(bad.err, "ASYNCPS_PORT"));
  CHECK(absl::StrContains(bad.err, "--port"));
}

TEST_CASE(
    "pod identity: --shard_index=auto from a StatefulSet host name, "
    "--worker_id=auto from JOB_COMPLETION_INDEX",
    "[cli][process][k8s]") {
  // As a StatefulSet pod asyncps-shard-1 of 2 gets it.
  Shard s0 = StartShard({"HOSTNAME=asyncps-shard-0", "ASYNCPS_SHARD_INDEX=auto",
                         "ASYNCPS_NUM_SHARDS=2", "ASYNCPS_LOG_LEVEL=warn"},
                        {});
  Shard s1 = StartShard({"HOSTNAME=asyncps-shard-1", "ASYNCPS_SHARD_INDEX=auto",
                         "ASYNCPS_NUM_SHARDS=2", "ASYNCPS_LOG_LEVEL=warn"},
                        {});
  StatusResponse st;
  REQUIRE(ShardRpc(s1.address).Status(&st).ok());
  CHECK(st.shard_index() == 1);
  CHECK(st.num_shards() == 2);

  const Run no_ordinal = RunBinary("server/ps_server", {"--shard_index=auto"},
                                   {"HOSTNAME=laptop"});
  CHECK(no_ordinal.code == 2);
  CHECK(absl::StrContains(no_ordinal.err, "--shard_index=auto"));

  // Two Indexed Job pods: worker ids from JOB_COMPLETION_INDEX.
  const std::string servers =
      absl::StrCat("ASYNCPS_SERVERS=", s0.address, ",", s1.address);
  const std::vector<std::string> common = {servers,
                                           "ASYNCPS_WORKER_ID=auto",
                                           "ASYNCPS_NUM_WORKERS=2",
                                           "ASYNCPS_STEPS=3",
                                           "ASYNCPS_EVALUATE=false",
                                           "ASYNCPS_HIDDEN=16",
                                           "OPENBLAS_NUM_THREADS=1"};
  std::vector<std::string> env0 = common, env1 = common;
  env0.push_back("JOB_COMPLETION_INDEX=0");
  env1.push_back("JOB_COMPLETION_INDEX=1");
  // Worker 1 waits for the tensors worker 0 creates: both run at once.
  std::string cmd1 = "exec env";
  for (const std::string& e : env1) absl::StrAppend(&cmd1, " '", e, "'");
  absl::StrAppend(&cmd1, " '", testing::RunfilePath("worker/ps_worker"), "'");
  absl::StatusOr<std::unique_ptr<Subprocess>> w1 =
      Subprocess::Start("/bin/sh", {"-c", cmd1});
  REQUIRE(w1.ok());
  const Run w0 = RunBinary("worker/ps_worker", {}, env0);
  INFO("worker 0: " << w0.err);
  absl::StatusOr<int> w1_code = (*w1)->Wait(absl::Seconds(120));
  INFO("worker 1: " << (*w1)->LogTail());
  CHECK(w0.code == 0);
  REQUIRE(w1_code.ok());
  CHECK(*w1_code == 0);
  CHECK(absl::StrContains((*w1)->ReadLog(), "worker1"));
  REQUIRE(ShardRpc(s0.address).Status(&st).ok());
  bool saw0 = false, saw1 = false;
  for (const WorkerStatus& w : st.workers()) {
    saw0 |= w.worker_id() == 0;
    saw1 |= w.worker_id() == 1;
  }
  CHECK(saw0);
  CHECK(saw1);

  const Run missing =
      RunBinary("worker/ps_worker", {}, {servers, "ASYNCPS_WORKER_ID=auto"});
  CHECK(missing.code == 2);
  CHECK(absl::StrContains(missing.err, "JOB_COMPLETION_INDEX"));
}

TEST_CASE("--etcd_endpoints where no etcd answers: exit 2 quickly, naming it",
          "[cli][process][etcd]") {
  absl::StatusOr<std::string> nowhere = testing::UnusedLoopbackAddress();
  REQUIRE(nowhere.ok());
  const std::vector<std::string> flags = {"--etcd_endpoints=" + *nowhere,
                                          "--run_id=r1"};
  for (const char* binary :
       {"worker/ps_worker", "tools/psctl", "serving/ps_serve"}) {
    std::vector<std::string> args = flags;
    if (std::string(binary) == "tools/psctl")
      args.insert(args.begin(), "status");
    const absl::Time start = absl::Now();
    const Run run = RunBinary(binary, args);
    INFO(binary << ": " << run.err);
    CHECK(run.code == 2);
    CHECK(absl::StrContains(
        run.err, "--etcd_endpoints: etcd at " + *nowhere + " does not answer"));
    CHECK(absl::StrContains(run.err, "that etcd runs there"));
    CHECK(absl::Now() - start < absl::Seconds(15));
  }
}

TEST_CASE(
    "with --etcd_endpoints, psctl and ps_worker find the shards in "
    "the run's map",
    "[cli][process][etcd]") {
  if (testing::SkipWithoutEtcd()) return;
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE(etcd.ok());
  Shard shard = StartShard({"ASYNCPS_LOG_LEVEL=warn"}, {"--run_id=flags"});
  {
    auto client = testing::ConnectToEtcd(*etcd);
    REQUIRE(client.ok());
    REQUIRE(MapStore(client->get(), RunPrefix("flags"))
                .Initialize(testing::OneShardMap("flags", {shard.address}))
                .ok());
  }
  const std::string endpoints = "--etcd_endpoints=" + etcd->endpoint;

  const Run status =
      RunBinary("tools/psctl", {"status", endpoints, "--run_id=flags"});
  INFO(status.out << status.err);
  CHECK(status.code == 0);
  CHECK(absl::StrContains(status.out, shard.address));
  // --servers as well: its count must be the map's.
  const Run both =
      RunBinary("tools/psctl", {"status", endpoints, "--run_id=flags",
                                "--servers=" + shard.address + ",127.0.0.1:1"});
  INFO(both.err);
  CHECK(both.code == 2);
  CHECK(absl::StrContains(both.err,
                          "--servers lists 2 shards, but the shard "
                          "map at /asyncps/flags/map has 1"));
  const Run other =
      RunBinary("tools/psctl", {"status", endpoints, "--run_id=other"});
  INFO(other.err);
  CHECK(other.code == 2);
  CHECK(absl::StrContains(other.err, "no shard map at /asyncps/other/map"));

  const Run worker = RunBinary("worker/ps_worker",
                               {endpoints, "--run_id=flags", "--steps=3",
                                "--hidden=16", "--evaluate=false"},
                               {"OPENBLAS_NUM_THREADS=1"});
  INFO(worker.err);
  CHECK(worker.code == 0);

  // The shard's group emptied: psctl names the missing primary.
  {
    auto client = testing::ConnectToEtcd(*etcd);
    REQUIRE(client.ok());
    REQUIRE(MapStore(client->get(), RunPrefix("flags"))
                .Update([](ShardMapRecord* m) -> absl::StatusOr<bool> {
                  m->mutable_groups(0)->clear_replicas();
                  return true;
                })
                .ok());
  }
  const Run empty =
      RunBinary("tools/psctl", {"status", endpoints, "--run_id=flags"});
  INFO(empty.out << empty.err);
  CHECK(empty.code == 1);
  CHECK(absl::StrContains(empty.out, "names no primary for this shard"));
}

}  // namespace
}  // namespace asyncps
