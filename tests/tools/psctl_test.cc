// The psctl binary against real ps_server shards and an address where
// nothing listens.

#include <signal.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "tests/monitoring/shard_rpc.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

using google::protobuf::Struct;
using testing::ServerProcess;
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
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs psctl with `args` (and the "NAME=value" assignments `env` added to
// its environment), stdout and stderr kept apart, within 60 s.
Run Psctl(const std::vector<std::string>& args,
          const std::vector<std::string>& env = {}) {
  const std::string out = testing::UniqueTmpPath("psctl_out");
  const std::string err = testing::UniqueTmpPath("psctl_err");
  std::string cmd = "exec env";
  for (const std::string& e : env) absl::StrAppend(&cmd, " '", e, "'");
  absl::StrAppend(&cmd, " '", testing::RunfilePath("tools/psctl"), "'");
  for (const std::string& a : args) absl::StrAppend(&cmd, " '", a, "'");
  absl::StrAppend(&cmd, " >'", out, "' 2>'", err, "'");
  absl::StatusOr<std::unique_ptr<Subprocess>> p =
      Subprocess::Start("/bin/sh", {"-c", cmd});
  REQUIRE(p.ok());
  absl::StatusOr<int> code = (*p)->Wait(absl::Seconds(60));
  INFO(cmd);
  REQUIRE(code.ok());
  return Run{*code, ReadFile(out), ReadFile(err)};
}

std::vector<ServerProcess> StartTwoShards() {
  absl::StatusOr<std::vector<ServerProcess>> cluster =
      testing::StartPsCluster(2, {"--log_level=warn"});
  REQUIRE(cluster.ok());
  // Some traffic: the tensor on both shards, an (empty) push from worker 7
  // to each, one pull from shard 0.
  PushResponse push;
  PullResponse pull;
  for (const ServerProcess& s : *cluster) {
    ShardRpc rpc(s.address);
    REQUIRE(rpc.Create(testing::ZerosSpec("w", 8, 4)).ok());
    REQUIRE(rpc.Push(7, 77, 0, 1, {}, "w", 4, &push).ok());
  }
  REQUIRE(ShardRpc((*cluster)[0].address).Pull(7, 77, 1, "w", &pull).ok());
  return *std::move(cluster);
}

TEST_CASE("psctl status --json: live shards in full, a dead one DOWN, exit 1",
          "[psctl][process]") {
  std::vector<ServerProcess> cluster = StartTwoShards();
  const absl::StatusOr<std::string> unused = testing::UnusedLoopbackAddress();
  REQUIRE(unused.ok());
  const std::string dead = *unused;
  const Run run = Psctl({"status",
                         absl::StrCat("--servers=", cluster[0].address, ",",
                                      cluster[1].address, ",", dead),
                         "--json", "--timeout=5s"});
  INFO("stdout:\n" << run.out << "\nstderr:\n" << run.err);
  CHECK(run.code == 1);

  Struct doc;
  REQUIRE(google::protobuf::util::JsonStringToMessage(run.out, &doc).ok());
  const auto& shards = doc.fields().at("shards").list_value().values();
  REQUIRE(shards.size() == 3);
  for (int i = 0; i < 2; ++i) {
    const auto& s = shards[i].struct_value().fields();
    CHECK(s.at("up").bool_value());
    CHECK(s.at("address").string_value() == cluster[i].address);
    const auto& st = s.at("status").struct_value().fields();
    CHECK(st.at("shard_index").number_value() == i);
    CHECK(st.at("num_shards").number_value() == 2);
    CHECK(
        st.at("counters").struct_value().fields().at("pushes").number_value() ==
        1);
  }
  const auto& down = shards[2].struct_value().fields();
  CHECK_FALSE(down.at("up").bool_value());
  CHECK(down.at("address").string_value() == dead);
  CHECK(absl::StartsWith(down.at("error").string_value(), "UNAVAILABLE"));

  const auto& sum = doc.fields().at("summary").struct_value().fields();
  CHECK(sum.at("shards_up").number_value() == 2);
  CHECK(sum.at("shards_down").number_value() == 1);
  CHECK(sum.at("tensors").number_value() == 1);
  CHECK(sum.at("slices").number_value() == 2);
  CHECK(sum.at("parameters").number_value() == 8);
  CHECK(sum.at("pushes").number_value() == 2);
  CHECK(sum.at("pulls").number_value() == 1);
  CHECK(sum.at("policy").string_value() ==
        "ASP, max_staleness -1, staleness_lr none");
  const auto& workers = doc.fields().at("workers").list_value().values();
  REQUIRE(workers.size() == 1);
  const auto& w = workers[0].struct_value().fields();
  CHECK(w.at("worker_id").number_value() == 7);
  CHECK(w.at("incarnation").string_value() == "77");
  CHECK(w.at("clock").number_value() == 1);
  CHECK(w.at("shards").number_value() == 2);
  CHECK(w.at("pushes").number_value() == 2);
  CHECK(w.at("state").string_value() == "live");

  // The text form says the same.
  const Run text = Psctl(
      {"status", absl::StrCat("--servers=", cluster[0].address, ",", dead)});
  INFO("text:\n" << text.out);
  CHECK(text.code == 1);
  CHECK(absl::StrContains(text.out, "cluster: 1/2 shards up (1 DOWN)"));
  CHECK(absl::StrContains(text.out, dead));
  CHECK(absl::StrContains(text.out, "DOWN   UNAVAILABLE"));
}

TEST_CASE("psctl exits 0 when every shard answers; tensors lists the tensor",
          "[psctl][process]") {
  std::vector<ServerProcess> cluster = StartTwoShards();
  const std::string servers = testing::ServerList(cluster);
  const Run run = Psctl({"status", "--servers=" + servers});
  INFO("stdout:\n" << run.out << "\nstderr:\n" << run.err);
  CHECK(run.code == 0);
  CHECK(absl::StrContains(run.out, "cluster: 2/2 shards up"));
  CHECK_FALSE(absl::StrContains(run.out, "DOWN"));
  CHECK(run.err.empty());

  const Run tensors = Psctl({"tensors", "--servers=" + servers});
  INFO("tensors:\n" << tensors.out);
  CHECK(tensors.code == 0);
  CHECK(absl::StrContains(tensors.out, "2/2 shards answered"));
  bool found = false;
  for (absl::string_view line : absl::StrSplit(tensors.out, '\n')) {
    if (absl::StartsWith(line, "w ")) {
      found = true;
      CHECK(absl::StrContains(line, "[8]"));
      CHECK(absl::StrContains(line, "2/2"));
      CHECK_FALSE(absl::StrContains(line, "MISMATCH"));
    }
  }
  CHECK(found);
}

TEST_CASE(
    "psctl -o table|wide|yaml, ASYNCPS_SERVERS, health, and aligned tensor "
    "columns",
    "[psctl][process]") {
  std::vector<ServerProcess> cluster = StartTwoShards();
  const std::string servers = testing::ServerList(cluster);
  const Run table = Psctl({"status"}, {"ASYNCPS_SERVERS=" + servers});
  INFO(table.out << table.err);
  CHECK(table.code == 0);
  CHECK(absl::StrContains(table.out, "cluster: 2/2 shards up"));
  CHECK_FALSE(absl::StrContains(table.out, "BYTES_IN"));
  const Run wide = Psctl({"status", "-o", "wide", "--servers=" + servers});
  CHECK(wide.code == 0);
  CHECK(absl::StrContains(wide.out, "BYTES_IN"));
  const Run yaml = Psctl({"status", "-oyaml", "--servers=" + servers});
  INFO(yaml.out);
  CHECK(yaml.code == 0);
  CHECK(absl::StartsWith(yaml.out, "shards:\n- index: 0\n  address: \""));
  CHECK(absl::StrContains(yaml.out, "\nproblems: []\n"));
  CHECK(absl::StrContains(yaml.out, "      pushes: 1\n"));
  CHECK(absl::StrContains(yaml.out, "  incarnation: \"77\"\n"));

  const Run health = Psctl({"health", "--servers=" + servers});
  INFO(health.out);
  CHECK(health.code == 0);
  CHECK(absl::StrContains(health.out, "SERVING"));

  // Every value of the tensors table starts under its header.
  const Run tensors = Psctl({"tensors", "-o", "wide", "--servers=" + servers});
  INFO(tensors.out);
  CHECK(tensors.code == 0);
  const std::vector<std::string> lines =
      absl::StrSplit(tensors.out, '\n', absl::SkipEmpty());
  REQUIRE(lines.size() == 3);
  const std::string& header = lines[1];
  const std::string& row = lines[2];
  CHECK(row.substr(header.find("INIT"), 5) == "zeros");
  CHECK(row.substr(header.find("OPTIMIZER"), 3) == "sgd");
  CHECK(row.size() <= header.size() + 1);
}

TEST_CASE("psctl tensors lists sparse tables beside the tensors",
          "[psctl][process]") {
  std::vector<ServerProcess> cluster = StartTwoShards();
  const std::string servers = testing::ServerList(cluster);
  TableSpec table;
  table.set_name("emb");
  table.set_dim(16);
  table.set_init(INIT_CONSTANT);
  table.set_init_value(0.25f);
  table.mutable_optimizer()->set_type(OPT_ADAGRAD);
  table.mutable_optimizer()->set_learning_rate(0.05f);
  table.mutable_optimizer()->set_epsilon(1e-8f);
  for (const ServerProcess& s : cluster) {
    const grpc::Status st = ShardRpc(s.address).CreateTable(table);
    INFO(st.error_message());
    REQUIRE(st.ok());
  }

  const Run text = Psctl({"tensors", "-o", "wide", "--servers=" + servers});
  INFO(text.out << text.err);
  CHECK(text.code == 0);
  const std::vector<std::string> lines =
      absl::StrSplit(text.out, '\n', absl::SkipEmpty());
  // "2/2 shards answered", the tensors' header and row, the tables' header
  // and row.
  REQUIRE(lines.size() == 5);
  const std::string& header = lines[3];
  const std::string& row = lines[4];
  REQUIRE(absl::StartsWith(header, "TABLE"));
  CHECK(absl::StartsWith(row, "emb "));
  CHECK(row.substr(header.find("INIT"), 8) == "constant");
  CHECK(row.substr(header.find("OPTIMIZER"), 7) == "adagrad");
  CHECK(absl::StrContains(row, "2/2"));
  // Numbers end where their header ends.
  const auto number_under = [&](const std::string& column, size_t width) {
    return row.substr(header.find(column) + column.size() - width, width);
  };
  CHECK(number_under("DIM", 2) == "16");
  CHECK(number_under("INIT_VALUE", 4) == "0.25");
  CHECK(number_under("LR", 4) == "0.05");

  const Run json = Psctl({"tensors", "-o", "json", "--servers=" + servers});
  CHECK(json.code == 0);
  Struct doc;
  REQUIRE(google::protobuf::util::JsonStringToMessage(json.out, &doc).ok());
  const auto& tables = doc.fields().at("tables").list_value().values();
  REQUIRE(tables.size() == 1);
  const auto& t = tables[0].struct_value().fields();
  CHECK(t.at("shards").number_value() == 2);
  CHECK(t.at("consistent").bool_value());
  CHECK(t.at("spec").struct_value().fields().at("dim").number_value() == 16);
  CHECK(doc.fields().at("tensors").list_value().values().size() == 1);
}

TEST_CASE("psctl names shards listed out of order and exits 1",
          "[psctl][process]") {
  std::vector<ServerProcess> cluster = StartTwoShards();
  const Run run =
      Psctl({"status", absl::StrCat("--servers=", cluster[1].address, ",",
                                    cluster[0].address)});
  INFO(run.out);
  CHECK(run.code == 1);
  CHECK(absl::StrContains(
      run.out, absl::StrCat("WARNING: the shard at ", cluster[1].address,
                            " is number 0 in --servers but reports "
                            "shard_index 1")));
  const Run json = Psctl(
      {"status", "-o", "json", absl::StrCat("--servers=", cluster[0].address)});
  CHECK(json.code == 1);
  CHECK(absl::StrContains(json.out,
                          "reports num_shards 2 but --servers lists 1"));
}

TEST_CASE("psctl --watch refreshes until SIGINT", "[psctl][process]") {
  absl::StatusOr<std::vector<ServerProcess>> cluster =
      testing::StartPsCluster(1, {"--log_level=warn"});
  REQUIRE(cluster.ok());
  absl::StatusOr<std::unique_ptr<Subprocess>> p =
      Subprocess::Start(testing::RunfilePath("tools/psctl"),
                        {"status", "--servers=" + testing::ServerList(*cluster),
                         "--watch=100ms"});
  REQUIRE(p.ok());
  Subprocess& psctl = **p;
  INFO("psctl log:\n" << psctl.LogTail());
  REQUIRE(testing::WaitFor(
              [&] {
                const std::string log = psctl.ReadLog();
                return absl::StrContains(log.substr(log.find("cluster:") + 1),
                                         "cluster:");
              },
              absl::Seconds(30), "two refreshes")
              .ok());
  REQUIRE(psctl.Signal(SIGINT).ok());
  absl::StatusOr<int> code = psctl.Wait(absl::Seconds(30));
  REQUIRE(code.ok());
  CHECK(*code == 0);
}

TEST_CASE("psctl rejects bad usage with exit 2, naming the flag",
          "[psctl][process]") {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"status", "--servers=127.0.0.1:1", "--bogus=1"}, "--bogus"},
      {{"status", "--servers=127.0.0.1:1", "--timeout=soon"}, "--timeout"},
      {{"status", "--servers=127.0.0.1:1", "--timeout=0s"}, "--timeout"},
      {{"status", "--servers=127.0.0.1:1", "--watch=-1s"}, "--watch"},
      {{"status", "--servers=127.0.0.1:1", "--nojson=1"}, "--nojson"},
      {{"status", "--servers=nohost"}, "--servers"},
      {{"status"}, "--servers"},
      {{"tensors", "--servers=127.0.0.1:1", "--watch=1s"}, "--watch"},
      {{"frobnicate", "--servers=127.0.0.1:1"}, "frobnicate"},
      {{"status", "--servers=127.0.0.1:1", "-o", "xml"}, "--output"},
      {{"status", "--servers=127.0.0.1:1", "--service=x"}, "--service"},
      {{}, "command"},
  };
  for (const Case& c : cases) {
    const Run run = Psctl(c.args);
    INFO("args: " << absl::StrJoin(c.args, " ") << "\nstderr: " << run.err);
    CHECK(run.code == 2);
    CHECK(absl::StrContains(run.err, c.message));
    CHECK(run.out.empty());
  }
}

}  // namespace
}  // namespace asyncps
