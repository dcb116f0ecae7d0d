// psctl's rendering: summary, merged workers, text table, JSON.

#include "tools/status_table.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace asyncps {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

WorkerStatus Worker(int id, uint64_t inc, int64_t clock, bool live,
                    int64_t age_ms, uint64_t pushes, bool left = false) {
  WorkerStatus w;
  w.set_worker_id(id);
  w.set_incarnation(inc);
  w.set_clock(clock);
  w.set_live(live);
  w.set_left(left);
  w.set_last_heartbeat_age_ms(age_ms);
  w.set_pushes(pushes);
  return w;
}

ShardResult Up(int index, uint64_t pushes, uint64_t p99, int64_t max_staleness,
               std::vector<WorkerStatus> workers) {
  ShardResult r;
  r.index = index;
  r.address = "10.0.0." + std::to_string(index) + ":7000";
  r.up = true;
  StatusResponse& s = r.status;
  s.set_shard_index(index);
  s.set_num_shards(3);
  s.set_uptime_ms(65000);
  s.set_tensors(2);
  s.set_slices(4 + index);
  s.set_parameter_bytes(400);
  s.mutable_counters()->set_pushes(pushes);
  s.mutable_counters()->set_pulls(2 * pushes);
  s.mutable_counters()->set_updates_applied(10);
  s.mutable_counters()->set_refused_stale(1);
  s.mutable_counters()->set_rejected_bad_input(index);
  s.mutable_rates()->set_pushes_per_s(1.5);
  s.mutable_staleness()->set_p99(p99);
  s.mutable_staleness()->set_max(p99 + 1);
  s.mutable_policy()->set_consistency(ASP);
  s.mutable_policy()->set_max_staleness(max_staleness);
  s.mutable_policy()->set_staleness_lr("none");
  int64_t lo = INT64_MAX, hi = 0;
  for (const WorkerStatus& w : workers) {
    *s.add_workers() = w;
    if (w.live()) {
      lo = std::min(lo, w.clock());
      hi = std::max(hi, w.clock());
    }
  }
  s.set_min_clock(lo == INT64_MAX ? 0 : lo);
  s.set_max_clock(hi);
  return r;
}

ShardResult Down(int index, const std::string& error) {
  ShardResult r;
  r.index = index;
  r.address = "10.0.0." + std::to_string(index) + ":7000";
  r.error = error;
  return r;
}

// Shard 0 and 1 up, shard 2 down. Worker 1 restarted (incarnation 6 on
// shard 1 replaces 5); worker 2 is live; worker 3 left.
std::vector<ShardResult> Cluster() {
  return {Up(0, 10, 3, 4,
             {Worker(1, 5, 20, true, 100, 7), Worker(2, 9, 12, true, 50, 3),
              Worker(3, 4, 9, false, 9000, 2, /*left=*/true)}),
          Up(1, 20, 7, 4,
             {Worker(1, 6, 2, true, 10, 1), Worker(2, 9, 14, true, 300, 4)}),
          Down(2, "UNAVAILABLE: connection \"refused\"\n")};
}

TEST_CASE("Summarize adds counters and takes the worst staleness", "[psctl]") {
  const ClusterSummary s = Summarize(Cluster());
  CHECK(s.shards_up == 2);
  CHECK(s.shards_down == 1);
  CHECK(s.tensors == 2);
  CHECK(s.slices == 4 + 5);
  CHECK(s.parameter_bytes == 800);
  CHECK(s.parameters == 200);
  CHECK(s.counters.pushes() == 30);
  CHECK(s.counters.pulls() == 60);
  CHECK(s.counters.updates_applied() == 20);
  CHECK(s.counters.refused_stale() == 2);
  CHECK(s.counters.rejected_bad_input() == 1);
  CHECK(s.rates.pushes_per_s() == Approx(3.0));
  CHECK(s.staleness_p99 == 7);
  CHECK(s.staleness_max == 8);
  CHECK(s.policy == "ASP, max_staleness 4, staleness_lr none");
  CHECK(s.min_clock == 2);
  CHECK(s.max_clock == 20);
  CHECK(s.workers == 3);
  CHECK(s.live_workers == 2);
}

TEST_CASE("Summarize reports disagreeing policies as mixed", "[psctl]") {
  std::vector<ShardResult> shards = {Up(0, 1, 0, 4, {}), Up(1, 1, 0, -1, {})};
  CHECK(Summarize(shards).policy ==
        "mixed: ASP, max_staleness -1, staleness_lr none | ASP, "
        "max_staleness 4, staleness_lr none");
  shards[0].status.mutable_policy()->set_consistency(SSP);
  shards[0].status.mutable_policy()->set_ssp_slack(3);
  CHECK(DescribePolicy(shards[0].status.policy()) ==
        "SSP slack 3, max_staleness 4, staleness_lr none");
}

TEST_CASE("MergeWorkers keeps the newest incarnation and merges its records",
          "[psctl]") {
  const std::vector<MergedWorker> w = MergeWorkers(Cluster());
  REQUIRE(w.size() == 3);
  // Worker 1: only incarnation 6 (shard 1) counts.
  CHECK(w[0].worker_id == 1);
  CHECK(w[0].incarnation == 6);
  CHECK(w[0].clock == 2);
  CHECK(w[0].pushes == 1);
  CHECK(w[0].shards == 1);
  CHECK(w[0].state() == "live");
  CHECK(w[0].lag == 12);  // fastest live clock is worker 2's 14
  // Worker 2: highest clock, most recent contact, pushes summed.
  CHECK(w[1].worker_id == 2);
  CHECK(w[1].clock == 14);
  CHECK(w[1].heartbeat_age_ms == 50);
  CHECK(w[1].pushes == 7);
  CHECK(w[1].shards == 2);
  CHECK(w[1].lag == 0);
  CHECK(w[2].worker_id == 3);
  CHECK(w[2].state() == "left");
  CHECK(w[2].lag == 0);
}

TEST_CASE(
    "the run and each worker's data position are shown; runs that "
    "differ are a warning",
    "[psctl]") {
  std::vector<ShardResult> shards = Cluster();  // shard 2 is down
  shards[0].status.set_run_id("job-7");
  shards[1].status.set_run_id("job-7");
  shards[1].status.mutable_workers(1)->set_trained(11);  // worker 2
  shards[0].status.mutable_workers(1)->set_trained(10);
  CHECK(Summarize(shards).run_id == "job-7");
  CHECK(Problems(shards).empty());
  const std::vector<MergedWorker> w = MergeWorkers(shards);
  REQUIRE(w.size() == 3);
  CHECK(w[1].trained == 11);  // the furthest any shard recorded
  const std::string text = RenderText(shards, /*wide=*/false);
  CHECK(absl::StrContains(text, "run: job-7"));
  CHECK(absl::StrContains(text, "TRAINED"));
  shards[1].status.set_run_id("job-8");
  const std::vector<std::string> problems = Problems(shards);
  REQUIRE(problems.size() == 1);
  CHECK(absl::StrContains(problems[0], "different runs (job-7, job-8)"));
  CHECK(Summarize(shards).run_id == "mixed: job-7 | job-8");
}

TEST_CASE(
    "RenderText: summary, aligned shard rows, DOWN row with the error, "
    "worker rows",
    "[psctl]") {
  const std::string text = RenderText(Cluster());
  INFO(text);
  CHECK(absl::StrContains(text, "cluster: 2/3 shards up (1 DOWN)"));
  CHECK(absl::StrContains(text, "policy: ASP, max_staleness 4"));
  CHECK(absl::StrContains(text, "pushes 30"));
  CHECK(absl::StrContains(text, "p99 7  max 8"));
  const std::vector<std::string> lines = absl::StrSplit(text, '\n');
  int header = -1;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (absl::StartsWith(lines[i], "SHARD ")) header = static_cast<int>(i);
  }
  REQUIRE(header >= 0);
  const std::string& h = lines[header];
  const std::string& row0 = lines[header + 1];
  const std::string& row2 = lines[header + 3];
  CHECK(absl::StartsWith(row0, "0/3"));
  CHECK(absl::StrContains(row0, "10.0.0.0:7000"));
  // Right-aligned numeric columns end where their header ends.
  const size_t pushes_end = h.find("PUSHES") + std::string("PUSHES").size();
  CHECK(row0.substr(pushes_end - 2, 2) == "10");
  CHECK(lines[header + 2].substr(pushes_end - 2, 2) == "20");
  CHECK(absl::StrContains(row0, "1m05s"));
  // The DOWN row names the address and the error.
  CHECK(absl::StartsWith(row2, "2"));
  CHECK(absl::StrContains(row2, "10.0.0.2:7000"));
  CHECK(absl::StrContains(row2, "DOWN"));
  CHECK(absl::StrContains(row2, "UNAVAILABLE: connection \"refused\""));
  CHECK(absl::StrContains(text, "WORKER"));
  // Incarnations in decimal, as in the shards' logs and the JSON.
  const size_t wt = text.find("\nWORKER");
  REQUIRE(wt != std::string::npos);
  const std::vector<std::string> first_worker = absl::StrSplit(
      text.substr(text.find('\n', wt + 1) + 1), ' ', absl::SkipEmpty());
  REQUIRE(first_worker.size() > 2);
  CHECK(first_worker[0] == "1");
  CHECK(first_worker[1] == "6");
  CHECK(absl::StrContains(text, "left"));
}

TEST_CASE("a shard that made lost slices anew is a warning", "[psctl]") {
  std::vector<ShardResult> shards = Cluster();  // shard 2 is down
  CHECK(Problems(shards).empty());
  shards[1].status.set_slices_remade(998);
  const std::vector<std::string> problems = Problems(shards);
  REQUIRE(problems.size() == 1);
  CHECK(absl::StrContains(problems[0],
                          "shard 1 (10.0.0.1:7000) made 998 slices anew"));
}

TEST_CASE("a shard whose checkpoints fail is a warning", "[psctl]") {
  std::vector<ShardResult> shards = Cluster();  // shard 2 is down
  CHECK(Problems(shards).empty());
  shards[0].status.set_checkpoint_error(
      "RESOURCE_EXHAUSTED: write d/shard-0-of-3.ckpt.tmp: No space left on "
      "device");
  shards[0].status.mutable_last_checkpoint()->set_path("d/shard-0-of-3.ckpt");
  shards[0].status.mutable_last_checkpoint()->set_unix_time_ms(
      absl::ToUnixMillis(absl::Now() - absl::Seconds(90)));
  shards[1].status.set_checkpoint_error("INTERNAL: fsync: Input/output error");
  const std::vector<std::string> problems = Problems(shards);
  REQUIRE(problems.size() == 2);
  CHECK(absl::StrContains(problems[0],
                          "shard 0 (10.0.0.0:7000) cannot write its "
                          "checkpoints (RESOURCE_EXHAUSTED: write"));
  CHECK(absl::StrContains(problems[0], "its last one, 1m3"));
  CHECK(absl::StrContains(problems[0], "is in memory only"));
  CHECK(absl::StrContains(problems[1], "none written yet"));
}

TEST_CASE("shards that serve different maps are a warning", "[psctl]") {
  std::vector<ShardResult> shards = Cluster();  // shard 2 is down
  for (ShardResult& r : shards) {
    r.status.mutable_map()->set_epoch(4);
    r.status.mutable_map()->set_num_slots(64);
  }
  CHECK(Problems(shards).empty());
  shards[1].status.mutable_map()->set_epoch(3);
  const std::vector<std::string> problems = Problems(shards);
  REQUIRE(problems.size() == 1);
  CHECK(absl::StrContains(problems[0],
                          "different maps (epoch 3 at 10.0.0.1:7000; epoch 4 "
                          "at 10.0.0.0:7000)"));
  CHECK(absl::StrContains(problems[0], "psctl adopt"));
  // A shard that is down serves nothing.
  shards[1].up = false;
  CHECK(Problems(shards).empty());
}

TEST_CASE("RenderText of an all-down cluster does not need any status",
          "[psctl]") {
  const std::string text = RenderText({Down(0, "DEADLINE_EXCEEDED: x")});
  CHECK(absl::StrContains(text, "cluster: 0/1 shards up (1 DOWN)"));
  CHECK(absl::StrContains(text, "DEADLINE_EXCEEDED: x"));
  CHECK_FALSE(absl::StrContains(text, "\nWORKER "));
}

TEST_CASE("RenderJson is one parsable document with escaped strings",
          "[psctl]") {
  const std::string json = RenderJson(Cluster());
  INFO(json);
  Struct doc;
  const auto parsed = google::protobuf::util::JsonStringToMessage(json, &doc);
  INFO(parsed.ToString());
  REQUIRE(parsed.ok());
  const auto& shards = doc.fields().at("shards").list_value().values();
  REQUIRE(shards.size() == 3);
  const auto& s0 = shards[0].struct_value().fields();
  CHECK(s0.at("up").bool_value());
  CHECK(s0.at("address").string_value() == "10.0.0.0:7000");
  const auto& st0 = s0.at("status").struct_value().fields();
  CHECK(st0.at("shard_index").number_value() == 0);  // zeros are printed
  // 64-bit counters are JSON numbers, like the summary's.
  CHECK(
      st0.at("counters").struct_value().fields().at("pushes").number_value() ==
      10);
  const auto& s2 = shards[2].struct_value().fields();
  CHECK_FALSE(s2.at("up").bool_value());
  CHECK(s2.at("error").string_value() ==
        "UNAVAILABLE: connection \"refused\"\n");
  CHECK(s2.count("status") == 0);

  const auto& sum = doc.fields().at("summary").struct_value().fields();
  CHECK(sum.at("shards_up").number_value() == 2);
  CHECK(sum.at("shards_down").number_value() == 1);
  CHECK(sum.at("pushes").number_value() == 30);
  CHECK(sum.at("staleness_p99").number_value() == 7);
  CHECK(sum.at("pushes_per_s").number_value() == Approx(3.0));
  const auto& workers = doc.fields().at("workers").list_value().values();
  REQUIRE(workers.size() == 3);
  CHECK(workers[1].struct_value().fields().at("clock").number_value() == 14);
  CHECK(workers[2].struct_value().fields().at("state").string_value() ==
        "left");
}

TEST_CASE("sparse tables are merged across shards with their imbalance",
          "[psctl][tables]") {
  std::vector<ShardResult> shards = {Up(0, 10, 1, -1, {}),
                                     Up(1, 20, 2, -1, {})};
  for (int i = 0; i < 2; ++i) {
    TableStatus* t = shards[i].status.add_tables();
    t->set_name("ctr/emb0");
    t->set_dim(16);
    t->set_optimizer(OPT_ADAGRAD);
    t->set_rows(i == 0 ? 1050 : 950);  // the fuller shard: 5% above even
    t->set_bytes(1000);
    t->set_rows_created(i == 0 ? 1100 : 1000);
    t->set_pulls(7);
    t->set_pushes(6);
    t->set_eviction(EVICT_LRU);
    t->set_admission(ADMIT_COUNT);
    t->set_fill_ratio(i == 0 ? 0.5 : 0.875);
    t->set_admission_refused(i == 0 ? 3 : 4);
    t->set_rows_evicted(5);
    t->set_rows_evicted_cap(i == 0 ? 5 : 0);
  }
  const std::vector<MergedTable> tables = MergeTables(shards);
  REQUIRE(tables.size() == 1);
  CHECK(tables[0].rows == 2000);
  CHECK(tables[0].rows_created == 2100);
  CHECK(tables[0].imbalance() == Approx(0.05));
  CHECK(tables[0].rows_evicted == 10);
  CHECK(tables[0].rows_evicted_cap == 5);
  CHECK(tables[0].admission_refused == 7);
  CHECK(tables[0].max_fill_ratio == Approx(0.875));
  const ClusterSummary sum = Summarize(shards);
  CHECK(sum.tables == 1);
  CHECK(sum.table_rows == 2000);
  CHECK(sum.table_bytes == 2000);

  const std::string text = RenderText(shards);
  INFO(text);
  CHECK(absl::StrContains(text, "  tables 1  rows 2000 (2.0 KiB)\n"));
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  auto header = std::find_if(lines.begin(), lines.end(), [](const auto& l) {
    return absl::StartsWith(l, "TABLE ");
  });
  REQUIRE(header != lines.end());
  const std::vector<std::string> row =
      absl::StrSplit(*(header + 1), ' ', absl::SkipEmpty());
  CHECK(row == std::vector<std::string>{"ctr/emb0", "adagrad", "16", "2000",
                                        "2.0", "KiB", "5.0%", "2100", "10",
                                        "14", "12", "lru/count", "88%", "7"});
  // No table section without tables.
  CHECK_FALSE(absl::StrContains(RenderText({Up(0, 1, 1, -1, {})}), "TABLE"));

  Struct doc;
  REQUIRE(google::protobuf::util::JsonStringToMessage(RenderJson(shards), &doc)
              .ok());
  const auto& summary = doc.fields().at("summary").struct_value().fields();
  CHECK(summary.at("tables").number_value() == 1);
  CHECK(summary.at("table_rows").number_value() == 2000);
}

TEST_CASE("learning rates: the latest step, and a shard that missed one",
          "[psctl]") {
  auto rate = [](const std::string& name, float lr, int64_t step) {
    LearningRate l;
    l.set_name(name);
    l.set_learning_rate(lr);
    l.set_step(step);
    return l;
  };
  std::vector<ShardResult> shards = {Up(0, 1, 0, -1, {}), Up(1, 1, 0, -1, {}),
                                     Up(2, 1, 0, -1, {})};
  for (ShardResult& r : shards) {
    *r.status.add_learning_rates() = rate("emb", 0.5f, 1);
    *r.status.add_learning_rates() = rate("w", 0.25f, r.index == 1 ? 2 : 3);
  }
  const std::vector<LearningRate> merged = MergeLearningRates(shards);
  REQUIRE(merged.size() == 2);
  CHECK(merged[0].name() == "emb");
  CHECK(merged[1].step() == 3);
  CHECK(merged[1].learning_rate() == 0.25f);
  const std::vector<std::string> problems = Problems(shards);
  REQUIRE(problems.size() == 1);
  CHECK(absl::StrContains(problems[0], "learning rate of w"));
  CHECK(absl::StrContains(problems[0], "not on shard(s) 1"));
  const std::string text = RenderText(shards, false);
  CHECK(absl::StrContains(text,
                          "learning rates: emb 0.5 (step 1), w 0.25 (step 3)"));
  Struct doc;
  REQUIRE(google::protobuf::util::JsonStringToMessage(RenderJson(shards), &doc)
              .ok());
  const Value& w = doc.fields()
                       .at("summary")
                       .struct_value()
                       .fields()
                       .at("learning_rates")
                       .struct_value()
                       .fields()
                       .at("w");
  CHECK(w.struct_value().fields().at("step").number_value() == 3);
}

TEST_CASE("JsonQuote escapes quotes, backslashes and control characters",
          "[psctl]") {
  CHECK(JsonQuote("a\"b\\c\n\t\x01") == "\"a\\\"b\\\\c\\n\\t\\u0001\"");
  CHECK(JsonQuote("") == "\"\"");
}

TEST_CASE("human units", "[psctl]") {
  CHECK(HumanBytes(0) == "0 B");
  CHECK(HumanBytes(1536) == "1.5 KiB");
  CHECK(HumanBytes(3.0 * 1024 * 1024 * 1024) == "3.0 GiB");
  CHECK(HumanDuration(12345) == "12.3s");
  CHECK(HumanDuration(3723000) == "1h02m03s");
  CHECK(HumanDuration(90061000) == "1d01h01m");
}

}  // namespace
}  // namespace asyncps
