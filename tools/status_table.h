#ifndef ASYNCPS_TOOLS_STATUS_TABLE_H_
#define ASYNCPS_TOOLS_STATUS_TABLE_H_

// Cluster-wide views of per-shard Status answers, for psctl: a summary, the
// workers merged across shards, and renderings as a text table or one JSON
// document. Pure functions of their input (no I/O), so they are unit-tested
// without servers.

#include <cstdint>
#include <string>
#include <vector>

#include "proto/asyncps.pb.h"
#include "tools/doc.h"

namespace asyncps {

// One shard's answer to Status, or why there is none.
struct ShardResult {
  int index = 0;        // position in the --servers list (= shard index)
  std::string address;  // as dialled
  bool up = false;
  std::string error;      // when !up: "CODE: message"
  StatusResponse status;  // when up
};

// Totals over the shards that answered.
struct ClusterSummary {
  int shards_up = 0;
  int shards_down = 0;  // of them, those no process holds (no address):
  int shards_unheld = 0;
  int32_t tensors = 0;  // most tensors any shard knows (every shard has all)
  int64_t slices = 0;
  uint64_t parameter_bytes = 0;
  uint64_t parameters = 0;  // float32 elements
  Counters counters;        // summed
  Rates rates;              // summed
  // Worst shard for each statistic.
  uint64_t staleness_p50 = 0, staleness_p90 = 0, staleness_p99 = 0,
           staleness_max = 0;
  // "ASP, max_staleness -1, staleness_lr none", or "mixed: a | b" when the
  // shards disagree; "" when none answered.
  std::string policy;
  // The shards' run (ps_server --run_id); "mixed: a | b" when they differ.
  std::string run_id;
  // The shard map they serve: "static" or "4096 slots, epoch 2"; "mixed:
  // a | b" when they differ.
  std::string map;
  bool any_live = false;  // some shard has a live worker; else no clocks
  int64_t min_clock = 0;  // slowest live worker on any shard
  int64_t max_clock = 0;  // fastest live worker on any shard
  int workers = 0;        // distinct worker ids
  int live_workers = 0;
  // Sparse tables: most any shard knows, and their rows and bytes summed.
  int32_t tables = 0;
  uint64_t table_rows = 0;
  uint64_t table_bytes = 0;
};

// One sparse table as the cluster holds it: each shard's share summed.
struct MergedTable {
  std::string name;
  int32_t dim = 0;
  OptimizerType optimizer = OPT_SGD;
  uint64_t rows = 0, bytes = 0, rows_created = 0, rows_evicted = 0, pulls = 0,
           pushes = 0;
  EvictionPolicy eviction = EVICT_TTL;
  AdmissionPolicy admission = ADMIT_ALL;
  uint64_t rows_evicted_cap = 0;   // of rows_evicted: to make room
  uint64_t admission_refused = 0;  // gradients the filter dropped
  double max_fill_ratio = 0;       // the fullest shard's (0 without a cap)
  int shards = 0;
  uint64_t max_shard_rows = 0;  // the fullest shard's rows
  // How far the fullest shard is above an even share: max / mean - 1.
  double imbalance() const;
};

// One worker as the cluster sees it. Only the newest incarnation seen on any
// shard counts; its records on the shards are merged.
struct MergedWorker {
  int32_t worker_id = 0;
  uint64_t incarnation = 0;
  int64_t clock = 0;  // the highest any shard has seen
  // Data position: steps of its share every shard acknowledged (the
  // highest any shard recorded; WorkerRef.trained).
  int64_t trained = 0;
  int64_t lag = 0;               // fastest live clock - clock; 0 when not live
  int64_t heartbeat_age_ms = 0;  // since the most recent contact with any shard
  uint64_t pushes = 0;           // push RPCs, summed over shards
  bool live = false;             // holds a lease on some shard
  bool left = false;             // said goodbye (and is live nowhere)
  int shards = 0;                // shards that know this incarnation
  // "live", "left" or "evicted".
  std::string state() const;
};

ClusterSummary Summarize(const std::vector<ShardResult>& shards);

// Sorted by worker id.
std::vector<MergedWorker> MergeWorkers(const std::vector<ShardResult>& shards);

// Sorted by name.
std::vector<MergedTable> MergeTables(const std::vector<ShardResult>& shards);

// The learning rates schedules set (StatusResponse.learning_rates), the
// latest step any up shard reports for each name, sorted by name.
std::vector<LearningRate> MergeLearningRates(
    const std::vector<ShardResult>& shards);

// A human-readable policy, e.g. "SSP slack 3, max_staleness 8,
// staleness_lr inverse".
std::string DescribePolicy(const StalenessPolicy& policy);

// Misconfigurations the answers reveal, one sentence each: a shard whose
// shard_index differs from its position in --servers (the list must be in
// shard order), or whose num_shards differs from the list's length, and a
// replicated shard with fewer than R caught-up replicas.
std::vector<std::string> Problems(const std::vector<ShardResult>& shards);

// The problems (as "WARNING: ..." lines), the cluster summary, a table with
// one row per shard (DOWN rows carry the error), a table with one row per
// replica of the replicated shards (when there are any: role, map epoch, the
// replica's last entry, a backup's lag in entries and whether answers wait
// for it), a table with one row per
// sparse table (when there are any) and a table with one row per worker. `wide`
// adds columns (bytes, rates, version, checkpoint).
std::string RenderText(const std::vector<ShardResult>& shards,
                       bool wide = false);

// One document (for JSON and YAML):
//   {"shards":[{"index":0,"address":"h:p","up":true,"status":{...}},
//              {"index":1,"address":"h:p","up":false,"error":"..."}],
//    "problems":["..."],"summary":{...},"workers":[{...}]}
// `status` is the StatusResponse with its proto field names (see
// DocFromMessage: numbers are numbers, incarnations decimal strings);
// summary min_clock/max_clock are null when no worker is live.
Doc StatusDoc(const std::vector<ShardResult>& shards);
// StatusDoc(shards).Json().
std::string RenderJson(const std::vector<ShardResult>& shards);

// A text table: a header row and data rows, columns as wide as their
// widest cell, two spaces apart; the first `left_columns` columns are
// left-aligned, the rest right-aligned. A row with fewer cells than the
// header spills its last cell over the remaining columns.
class TextTable {
 public:
  TextTable(std::vector<std::string> header, int left_columns)
      : header_(std::move(header)), left_columns_(left_columns) {}
  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string Render() const;

 private:
  const std::vector<std::string> header_;
  const int left_columns_;
  std::vector<std::vector<std::string>> rows_;
};

// 1536 -> "1.5 KiB".
std::string HumanBytes(double bytes);
// 3723000 -> "1h02m03s"; under a minute with one decimal ("12.3s").
std::string HumanDuration(int64_t ms);

}  // namespace asyncps

#endif  // ASYNCPS_TOOLS_STATUS_TABLE_H_
