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
  int shards_down = 0;
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
  int64_t min_clock = 0;  // slowest live worker on any shard
  int64_t max_clock = 0;  // fastest live worker on any shard
  int workers = 0;        // distinct worker ids
  int live_workers = 0;
};

// One worker as the cluster sees it. Only the newest incarnation seen on any
// shard counts; its records on the shards are merged.
struct MergedWorker {
  int32_t worker_id = 0;
  uint64_t incarnation = 0;
  int64_t clock = 0;             // the highest any shard has seen
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

// A human-readable policy, e.g. "SSP slack 3, max_staleness 8,
// staleness_lr inverse".
std::string DescribePolicy(const StalenessPolicy& policy);

// The cluster summary, a table with one row per shard (DOWN rows carry the
// error), and a table with one row per worker.
std::string RenderText(const std::vector<ShardResult>& shards);

// One JSON document:
//   {"shards":[{"index":0,"address":"h:p","up":true,"status":{...}},
//              {"index":1,"address":"h:p","up":false,"error":"..."}],
//    "summary":{...},"workers":[{...}]}
// `status` is the StatusResponse in protobuf's JSON mapping with the proto
// field names (64-bit integers as strings, as that mapping has it); summary
// and worker numbers are plain JSON numbers.
std::string RenderJson(const std::vector<ShardResult>& shards);

// `s` as a JSON string literal, quotes included.
std::string JsonQuote(const std::string& s);

// 1536 -> "1.5 KiB".
std::string HumanBytes(double bytes);
// 3723000 -> "1h02m03s"; under a minute with one decimal ("12.3s").
std::string HumanDuration(int64_t ms);

}  // namespace asyncps

#endif  // ASYNCPS_TOOLS_STATUS_TABLE_H_
