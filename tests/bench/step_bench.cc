// step_bench: the latency of a CTR-shaped training step's pull and push
// against ps_server processes on loopback, sent as one call (PullSet /
// PushSet: one request per shard) and as the two calls a step made before
// (tensors and rows started together, each its own request per shard),
// alternating in every repetition so that both see the same machine.
//
// The step: the dense tensors of a 160-64-32-1 MLP (12.5k floats) and
// --fields tables of --dim floats per row, --batch ids each, drawn
// Zipf(1.2) over 100k ranks (rows exist before timing). Output, one line
// per form and operation, then the ratios of the medians:
//   form=one op=push p50_us=... p90_us=... steps=...
//   op=push split_over_one_p50=1.42

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/random/distributions.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "client/ps_client.h"
#include "tests/testing/subprocess.h"

ABSL_FLAG(int, shards, 2, "ps_server processes");
ABSL_FLAG(int, fields, 8, "tables (one per categorical field)");
ABSL_FLAG(int, dim, 16, "floats per row");
ABSL_FLAG(int, batch, 256, "ids per table per step");
ABSL_FLAG(int, steps, 400, "steps per form per repetition");
ABSL_FLAG(int, reps, 5, "repetitions (forms alternate in each)");

namespace asyncps {
namespace {

using SteadyClock = std::chrono::steady_clock;

struct Step {
  std::vector<std::vector<float>> dense, dense_grads;
  std::vector<std::vector<uint64_t>> ids;
  std::vector<std::vector<float>> rows, row_grads;
  PullSet pull;
  PushSet push;
};

double Micros(SteadyClock::time_point a, SteadyClock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

void Die(const absl::Status& s) {
  std::fprintf(stderr, "step_bench: %s\n", s.ToString().c_str());
  std::exit(1);
}

// One step's pull and push as one call each; appends their latencies.
void OneCall(PsClient* c, Step* s, int64_t clock, std::vector<double>* pull,
             std::vector<double>* push) {
  const auto t0 = SteadyClock::now();
  auto p = c->StartPull(clock, clock, s->pull);
  if (absl::Status st = p->Wait(); !st.ok()) Die(st);
  const auto t1 = SteadyClock::now();
  absl::StatusOr<PushSummary> d =
      c->StartPush(clock, s->push, p->read())->Wait();
  if (!d.ok()) Die(d.status());
  const auto t2 = SteadyClock::now();
  pull->push_back(Micros(t0, t1));
  push->push_back(Micros(t1, t2));
}

// The same as two calls each (tensors, rows), in flight together.
void TwoCalls(PsClient* c, Step* s, int64_t clock, std::vector<double>* pull,
              std::vector<double>* push) {
  const auto t0 = SteadyClock::now();
  auto pd = c->StartPull(clock, clock, s->pull.tensors);
  auto pr = c->StartPullRows(clock, clock, s->pull.rows);
  if (absl::Status st = pd->Wait(); !st.ok()) Die(st);
  if (absl::Status st = pr->Wait(); !st.ok()) Die(st);
  const auto t1 = SteadyClock::now();
  auto sd = c->StartPush(clock, s->push.tensors, pd->read());
  auto sr = c->StartPushRows(clock, s->push.rows, pr->read());
  if (absl::Status st = sd->Wait().status(); !st.ok()) Die(st);
  if (absl::Status st = sr->Wait().status(); !st.ok()) Die(st);
  const auto t2 = SteadyClock::now();
  pull->push_back(Micros(t0, t1));
  push->push_back(Micros(t1, t2));
}

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * (v.size() - 1))];
}

int Run() {
  absl::StatusOr<std::vector<testing::ServerProcess>> cluster =
      testing::StartPsCluster(absl::GetFlag(FLAGS_shards),
                              {"--log_level=warn"});
  if (!cluster.ok()) Die(cluster.status());
  PsClientOptions options;
  for (const auto& s : *cluster) options.servers.push_back(s.address);
  absl::StatusOr<std::unique_ptr<PsClient>> client = PsClient::Connect(options);
  if (!client.ok()) Die(client.status());
  PsClient& c = **client;
  if (absl::Status s = c.WaitForShards(absl::Seconds(30)); !s.ok()) Die(s);

  const int fields = absl::GetFlag(FLAGS_fields),
            dim = absl::GetFlag(FLAGS_dim);
  const int batch = absl::GetFlag(FLAGS_batch);
  OptimizerSpec sgd;
  sgd.set_type(OPT_SGD);
  sgd.set_learning_rate(1e-6f);
  const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"mlp/w0", {160, 64}}, {"mlp/b0", {64}},    {"mlp/w1", {64, 32}},
      {"mlp/b1", {32}},      {"mlp/w2", {32, 1}}, {"mlp/b2", {1}}};
  std::vector<TensorSpec> specs;
  for (const auto& [name, shape] : shapes) {
    TensorSpec t;
    t.set_name(name);
    for (int64_t d : shape) t.add_shape(d);
    t.set_init(INIT_CONSTANT);
    *t.mutable_optimizer() = sgd;
    specs.push_back(t);
  }
  std::vector<TableSpec> tables;
  for (int f = 0; f < fields; ++f) {
    TableSpec t;
    t.set_name(absl::StrCat("emb", f));
    t.set_dim(dim);
    t.set_init(INIT_UNIFORM);
    t.set_init_value(0.01f);
    *t.mutable_optimizer() = sgd;
    tables.push_back(t);
  }
  if (absl::Status s = c.CreateTensors(specs); !s.ok()) Die(s);
  if (absl::Status s = c.CreateTables(tables); !s.ok()) Die(s);
  if (absl::Status s = c.Register().status(); !s.ok()) Die(s);

  Step step;
  absl::BitGen gen;
  for (const auto& [name, shape] : shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    step.dense.emplace_back(n);
    step.dense_grads.emplace_back(n, 0.01f);
  }
  for (int f = 0; f < fields; ++f) {
    std::vector<uint64_t> ids(batch);
    for (uint64_t& id : ids) id = absl::Zipf<uint64_t>(gen, 100000, 1.2) * 7919;
    step.ids.push_back(ids);
    step.rows.emplace_back(static_cast<size_t>(batch) * dim);
    step.row_grads.emplace_back(static_cast<size_t>(batch) * dim, 0.01f);
  }
  for (size_t k = 0; k < shapes.size(); ++k) {
    step.pull.tensors.emplace_back(shapes[k].first, step.dense[k].data());
    step.push.tensors.emplace_back(shapes[k].first, step.dense_grads[k].data());
  }
  for (int f = 0; f < fields; ++f) {
    step.pull.rows.push_back(
        {tables[f].name(), step.ids[f], step.rows[f].data()});
    step.push.rows.push_back(
        {tables[f].name(), step.ids[f], step.row_grads[f].data()});
  }

  std::vector<double> one_pull, one_push, two_pull, two_push;
  int64_t clock = 0;
  std::vector<double> warm_pull, warm_push;
  for (int i = 0; i < 50; ++i)
    OneCall(&c, &step, clock++, &warm_pull, &warm_push);
  for (int r = 0; r < absl::GetFlag(FLAGS_reps); ++r) {
    for (int i = 0; i < absl::GetFlag(FLAGS_steps); ++i) {
      OneCall(&c, &step, clock++, &one_pull, &one_push);
    }
    for (int i = 0; i < absl::GetFlag(FLAGS_steps); ++i) {
      TwoCalls(&c, &step, clock++, &two_pull, &two_push);
    }
  }
  const auto line = [](const char* form, const char* op,
                       const std::vector<double>& v) {
    std::printf("form=%s op=%s p50_us=%.0f p90_us=%.0f steps=%zu\n", form, op,
                Percentile(v, 0.5), Percentile(v, 0.9), v.size());
  };
  line("one", "pull", one_pull);
  line("two", "pull", two_pull);
  line("one", "push", one_push);
  line("two", "push", two_push);
  std::printf("op=pull two_over_one_p50=%.2f\n",
              Percentile(two_pull, 0.5) / Percentile(one_pull, 0.5));
  std::printf("op=push two_over_one_p50=%.2f\n",
              Percentile(two_push, 0.5) / Percentile(one_push, 0.5));
  return 0;
}

}  // namespace
}  // namespace asyncps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return asyncps::Run();
}
