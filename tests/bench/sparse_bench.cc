// sparse_bench: rows pulled and pushed per second through PsClient's sparse
// table path against ps_server processes on loopback, next to the dense path
// moving the same number of floats, measured in the same run.
//
// For each shard count (--shards) the bench starts that many ps_server
// processes and creates one table (--dim floats per row, SGD) and, for each
// batch size (--batches, ids per call), one dense tensor of batch x dim
// floats (SGD). Ids are drawn Zipf(--zipf) over --vocab ranks and hashed, as
// the CTR model's fields are, so batches repeat ids (the client sends each
// distinct id once) and ids spread over the shards. Every table row a batch
// names exists before timing starts (a first pull creates them). Measured,
// interleaved in every repetition:
//   rows pull   PsClient::StartPullRows of one batch (de-duplicated, routed,
//               scattered back to every position);
//   rows push   PsClient::StartPushRows of one batch of gradients (summed
//               per distinct id, routed, applied with per-row versions);
//   dense pull  PsClient::Pull of the tensor of the same number of floats;
//   dense push  PsClient::Push of it.
// rows_per_s counts batch positions (ids) per second; mb_per_s the float
// payload (1e6 bytes) of the positions, so the two paths compare at equal
// payload. Every figure is the median of --reps runs of at least
// --min_seconds.
//
// Output, one line per measurement, then the ratios:
//   shards=1 ids=16384 distinct=5123 op=pull impl=rows rows_per_s=...
//   mb_per_s=... shards=1 ids=16384 op=pull ratio_rows_over_dense=0.41

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/ps_client.h"
#include "common/net.h"
#include "tests/testing/subprocess.h"
#include "worker/ctr_data.h"

ABSL_FLAG(std::string, batches, "1024,4096,16384,65536",
          "comma-separated ids per call");
ABSL_FLAG(std::string, shards, "1,2", "comma-separated shard counts");
ABSL_FLAG(int, dim, 16, "floats per table row");
ABSL_FLAG(int64_t, vocab, 10000000, "distinct ids the Zipf law ranges over");
ABSL_FLAG(double, zipf, 1.1, "Zipf exponent of the ids");
ABSL_FLAG(int, reps, 3, "timed runs per measurement (median reported)");
ABSL_FLAG(double, min_seconds, 1.0, "length of one timed run");
ABSL_FLAG(int, distinct_batches, 8,
          "batches of ids generated per size (the calls cycle through them)");

namespace asyncps {
namespace {

using SteadyClock = std::chrono::steady_clock;

std::vector<int> ParseList(const std::string& s) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(s, ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(part, &v) || v <= 0) {
      std::fprintf(stderr, "sparse_bench: bad list entry '%s'\n",
                   std::string(part).c_str());
      std::exit(2);
    }
    out.push_back(v);
  }
  return out;
}

// Calls per second of `call`, median over the repetitions; exits on error.
double CallsPerSecond(const std::function<absl::Status()>& call) {
  std::vector<double> rates;
  for (int r = 0; r < absl::GetFlag(FLAGS_reps); ++r) {
    const auto start = SteadyClock::now();
    int64_t calls = 0;
    double seconds = 0;
    do {
      const absl::Status s = call();
      if (!s.ok()) {
        std::fprintf(stderr, "sparse_bench: %s\n", s.ToString().c_str());
        std::exit(1);
      }
      ++calls;
      seconds =
          std::chrono::duration<double>(SteadyClock::now() - start).count();
    } while (seconds < absl::GetFlag(FLAGS_min_seconds));
    rates.push_back(calls / seconds);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

int Run(int shards) {
  absl::StatusOr<std::vector<testing::ServerProcess>> cluster =
      testing::StartPsCluster(shards, {"--log_level=warn"});
  if (!cluster.ok()) {
    std::fprintf(stderr, "sparse_bench: %s\n",
                 cluster.status().ToString().c_str());
    return 1;
  }
  PsClientOptions options;
  for (const auto& s : *cluster) options.servers.push_back(s.address);
  absl::StatusOr<std::unique_ptr<PsClient>> client = PsClient::Connect(options);
  if (!client.ok()) return 1;
  PsClient& c = **client;
  const int dim = absl::GetFlag(FLAGS_dim);
  TableSpec table;
  table.set_name("bench/emb");
  table.set_dim(dim);
  table.set_init(INIT_UNIFORM);
  table.set_init_value(0.01f);
  table.mutable_optimizer()->set_type(OPT_SGD);
  table.mutable_optimizer()->set_learning_rate(1e-6f);
  if (!c.WaitForShards(absl::Seconds(30)).ok() ||
      !c.CreateTables({table}).ok()) {
    std::fprintf(stderr, "sparse_bench: cannot create the table\n");
    return 1;
  }
  CtrDataOptions zipf;
  zipf.vocab = {absl::GetFlag(FLAGS_vocab)};
  zipf.zipf_exponent = absl::GetFlag(FLAGS_zipf);
  zipf.dense_features = 0;
  const CtrData data(zipf);

  for (int batch : ParseList(absl::GetFlag(FLAGS_batches))) {
    // Batches of Zipf ids; their rows created before timing.
    std::vector<std::vector<uint64_t>> ids;
    double distinct = 0;
    for (int b = 0; b < absl::GetFlag(FLAGS_distinct_batches); ++b) {
      CtrExamples e =
          data.Generate(CtrSplit::kTrain, static_cast<int64_t>(b) * batch,
                        static_cast<int64_t>(b + 1) * batch);
      ids.push_back(std::move(e.ids));
      distinct +=
          absl::flat_hash_set<uint64_t>(ids.back().begin(), ids.back().end())
              .size();
    }
    distinct /= ids.size();
    std::vector<float> rows(static_cast<size_t>(batch) * dim);
    std::vector<float> grads(rows.size(), 1.0f);
    ReadSet read;
    for (const auto& b : ids) {
      auto p = c.StartPullRows(0, 0, {{"bench/emb", b, rows.data()}});
      if (!p->Wait().ok()) return 1;
      read = p->read();
    }
    const std::string dense = absl::StrCat("bench/dense", batch);
    TensorSpec spec;
    spec.set_name(dense);
    spec.add_shape(static_cast<int64_t>(batch) * dim);
    spec.mutable_optimizer()->set_type(OPT_SGD);
    spec.mutable_optimizer()->set_learning_rate(1e-6f);
    if (!c.CreateTensors({spec}).ok()) return 1;
    std::vector<float> values(rows.size());

    size_t next = 0;
    const double rows_pull = CallsPerSecond([&] {
      const auto& b = ids[next++ % ids.size()];
      return c.StartPullRows(0, 0, {{"bench/emb", b, rows.data()}})->Wait();
    });
    const double rows_push = CallsPerSecond([&] {
      const auto& b = ids[next++ % ids.size()];
      return c.StartPushRows(0, {{"bench/emb", b, grads.data()}}, read)
          ->Wait()
          .status();
    });
    const double dense_pull = CallsPerSecond([&] {
      return c.Pull(0, {{dense, values.data()}});
    });
    const double dense_push = CallsPerSecond([&] {
      return c.Push(0, {{dense, grads.data()}}).status();
    });

    const double mb = static_cast<double>(batch) * dim * sizeof(float) / 1e6;
    auto line = [&](const char* op, const char* impl, double calls) {
      std::printf(
          "shards=%d ids=%d distinct=%.0f op=%s impl=%s rows_per_s=%.0f "
          "mb_per_s=%.1f calls_per_s=%.1f\n",
          shards, batch, distinct, op, impl, calls * batch, calls * mb, calls);
    };
    line("pull", "rows", rows_pull);
    line("pull", "dense", dense_pull);
    line("push", "rows", rows_push);
    line("push", "dense", dense_push);
    std::printf("shards=%d ids=%d op=pull ratio_rows_over_dense=%.2f\n", shards,
                batch, rows_pull / dense_pull);
    std::printf("shards=%d ids=%d op=push ratio_rows_over_dense=%.2f\n", shards,
                batch, rows_push / dense_push);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace asyncps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  asyncps::TuneMallocForLargeMessages();
  for (int shards : asyncps::ParseList(absl::GetFlag(FLAGS_shards))) {
    const int rc = asyncps::Run(shards);
    if (rc != 0) return rc;
  }
  return 0;
}
