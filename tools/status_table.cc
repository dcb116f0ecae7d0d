#include "tools/status_table.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/json_util.h"

namespace asyncps {

namespace {

std::string Rate(double per_s) { return absl::StrFormat("%.1f", per_s); }

void AddCounters(const Counters& c, Counters* sum) {
  sum->set_pulls(sum->pulls() + c.pulls());
  sum->set_pushes(sum->pushes() + c.pushes());
  sum->set_duplicate_pushes(sum->duplicate_pushes() + c.duplicate_pushes());
  sum->set_updates_applied(sum->updates_applied() + c.updates_applied());
  sum->set_refused_stale(sum->refused_stale() + c.refused_stale());
  sum->set_scaled(sum->scaled() + c.scaled());
  sum->set_rejected_bad_input(sum->rejected_bad_input() +
                              c.rejected_bad_input());
  sum->set_bytes_in(sum->bytes_in() + c.bytes_in());
  sum->set_bytes_out(sum->bytes_out() + c.bytes_out());
  sum->set_evictions(sum->evictions() + c.evictions());
  sum->set_pull_waits(sum->pull_waits() + c.pull_waits());
  sum->set_steps(sum->steps() + c.steps());
  sum->set_pull_wait_timeouts(sum->pull_wait_timeouts() +
                              c.pull_wait_timeouts());
  sum->set_checkpoints_written(sum->checkpoints_written() +
                               c.checkpoints_written());
  sum->set_checkpoints_failed(sum->checkpoints_failed() +
                              c.checkpoints_failed());
}

void AddRates(const Rates& r, Rates* sum) {
  sum->set_interval_s(std::max(sum->interval_s(), r.interval_s()));
  sum->set_pushes_per_s(sum->pushes_per_s() + r.pushes_per_s());
  sum->set_pulls_per_s(sum->pulls_per_s() + r.pulls_per_s());
  sum->set_updates_per_s(sum->updates_per_s() + r.updates_per_s());
  sum->set_bytes_in_per_s(sum->bytes_in_per_s() + r.bytes_in_per_s());
  sum->set_bytes_out_per_s(sum->bytes_out_per_s() + r.bytes_out_per_s());
}

}  // namespace

std::string TextTable::Render() const {
  std::vector<size_t> width(header_.size(), 0);
  auto measure = [&](const std::vector<std::string>& row) {
    // A short row's last cell spans the rest; it does not widen a column.
    const size_t n = row.size() < header_.size() ? row.size() - 1 : row.size();
    for (size_t i = 0; i < n && i < width.size(); ++i) {
      width[i] = std::max(width[i], row[i].size());
    }
  };
  measure(header_);
  for (const auto& row : rows_) measure(row);
  std::string out;
  auto emit = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      if (i > 0) line += "  ";
      const bool spill = row.size() < header_.size() && i == row.size() - 1;
      if (spill || i >= width.size()) {
        line += row[i];
      } else if (static_cast<int>(i) < left_columns_) {
        line += row[i];
        if (i + 1 < row.size()) line.append(width[i] - row[i].size(), ' ');
      } else {
        line.append(width[i] - row[i].size(), ' ');
        line += row[i];
      }
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    absl::StrAppend(&out, line, "\n");
  };
  emit(header_);
  for (const auto& row : rows_) emit(row);
  return out;
}

std::vector<std::string> Problems(const std::vector<ShardResult>& shards) {
  std::vector<std::string> out;
  for (const ShardResult& r : shards) {
    if (!r.up) continue;
    const StatusResponse& st = r.status;
    if (st.has_replica()) {
      int held = st.replica().role() == "primary" ? 1 : 0;
      for (const auto& b : st.replica().backups()) held += b.caught_up();
      if (held < st.replica().replicas()) {
        out.push_back(absl::StrCat(
            "shard ", r.index, " has ", held, " of ", st.replica().replicas(),
            " replicas caught up (", r.address, " is ", st.replica().role(),
            "): start server processes for it, or wait for its spares"));
      }
    }
    if (!st.checkpoint_error().empty()) {
      const CheckpointInfo& last = st.last_checkpoint();
      const int64_t age_ms =
          absl::ToUnixMillis(absl::Now()) - last.unix_time_ms();
      out.push_back(absl::StrCat(
          "shard ", r.index, " (", r.address,
          ") cannot write its checkpoints (", st.checkpoint_error(),
          "): what it applied since ",
          last.path().empty()
              ? "it started is in memory only (none written yet)"
              : absl::StrCat("its last one, ", HumanDuration(age_ms),
                             " ago, is in memory only")));
    }
    if (st.slices_remade() > 0) {
      out.push_back(absl::StrCat(
          "shard ", r.index, " (", r.address, ") made ", st.slices_remade(),
          " slices anew: the run's map gave it slots whose state was lost "
          "with every replica that held them, and their updates are gone "
          "(its log names the map epoch)"));
    }
    if (st.shard_index() != r.index) {
      out.push_back(absl::StrCat(
          "the shard at ", r.address, " is number ", r.index,
          " in --servers but reports shard_index ", st.shard_index(),
          ": list the shards in shard-index order (workers must use the "
          "same order)"));
    }
    if (st.num_shards() != static_cast<int32_t>(shards.size())) {
      out.push_back(absl::StrCat(
          "the shard at ", r.address, " reports num_shards ", st.num_shards(),
          " but --servers lists ", shards.size(), " address(es)"));
    }
  }
  std::set<std::string> runs;
  for (const ShardResult& r : shards) {
    if (r.up) runs.insert(r.status.run_id());
  }
  if (runs.size() > 1) {
    out.push_back(absl::StrCat("the shards belong to different runs (",
                               absl::StrJoin(runs, ", "),
                               "): workers of one run are refused by the "
                               "others"));
  }
  // Shards behind the map of the others refuse every request routed by
  // it ("retry") until they adopt it. A move leaves them so for
  // milliseconds; longer, a shard restarted on older files missed it.
  std::map<uint64_t, std::vector<std::string>> by_epoch;
  for (const ShardResult& r : shards) {
    if (r.up && runs.size() == 1) {
      by_epoch[r.status.map().epoch()].push_back(r.address);
    }
  }
  if (by_epoch.size() > 1) {
    std::vector<std::string> parts;
    for (const auto& [epoch, addresses] : by_epoch) {
      parts.push_back(absl::StrCat("epoch ", epoch, " at ",
                                   absl::StrJoin(addresses, ", ")));
    }
    out.push_back(absl::StrCat(
        "the shards serve different maps (", absl::StrJoin(parts, "; "),
        "): requests routed by the newest are refused by the others until "
        "they adopt it (with etcd they do by themselves; else psctl adopt)"));
  }
  // A schedule step some up shard lacks (a SetLearningRate that failed
  // there and was not retried).
  for (const LearningRate& latest : MergeLearningRates(shards)) {
    std::vector<std::string> behind;
    for (const ShardResult& r : shards) {
      if (!r.up) continue;
      int64_t step = 0;
      for (const LearningRate& l : r.status.learning_rates()) {
        if (l.name() == latest.name()) step = l.step();
      }
      if (step != latest.step()) behind.push_back(absl::StrCat(r.index));
    }
    if (!behind.empty()) {
      out.push_back(
          absl::StrCat("the learning rate of ", latest.name(), " is ",
                       latest.learning_rate(), " from schedule step ",
                       latest.step(), " on some shards but not on shard(s) ",
                       absl::StrJoin(behind, ", "), ": set it again"));
    }
  }
  return out;
}

std::vector<LearningRate> MergeLearningRates(
    const std::vector<ShardResult>& shards) {
  std::map<std::string, LearningRate> latest;
  for (const ShardResult& r : shards) {
    if (!r.up) continue;
    for (const LearningRate& l : r.status.learning_rates()) {
      auto [it, added] = latest.emplace(l.name(), l);
      if (!added && l.step() > it->second.step()) it->second = l;
    }
  }
  std::vector<LearningRate> out;
  for (auto& [name, l] : latest) out.push_back(std::move(l));
  return out;
}

std::string MergedWorker::state() const {
  if (live) return "live";
  return left ? "left" : "evicted";
}

std::string HumanBytes(double bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 5) {
    bytes /= 1024;
    ++unit;
  }
  if (unit == 0) return absl::StrFormat("%.0f B", bytes);
  return absl::StrFormat("%.1f %s", bytes, kUnits[unit]);
}

std::string HumanDuration(int64_t ms) {
  if (ms < 0) ms = 0;
  if (ms < 60 * 1000) return absl::StrFormat("%.1fs", ms / 1000.0);
  const int64_t s = ms / 1000;
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  if (s < 86400) {
    return absl::StrFormat("%dh%02dm%02ds", s / 3600, (s / 60) % 60, s % 60);
  }
  return absl::StrFormat("%dd%02dh%02dm", s / 86400, (s / 3600) % 24,
                         (s / 60) % 60);
}

std::string DescribePolicy(const StalenessPolicy& p) {
  std::string mode = Consistency_Name(p.consistency());
  if (p.consistency() == SSP) absl::StrAppend(&mode, " slack ", p.ssp_slack());
  return absl::StrCat(mode, ", max_staleness ", p.max_staleness(),
                      ", staleness_lr ",
                      p.staleness_lr().empty() ? "none" : p.staleness_lr());
}

ClusterSummary Summarize(const std::vector<ShardResult>& shards) {
  ClusterSummary sum;
  std::set<std::string> policies, runs, maps;
  bool any_clock = false;
  for (const ShardResult& r : shards) {
    if (!r.up) {
      ++sum.shards_down;
      if (r.address.empty()) ++sum.shards_unheld;
      continue;
    }
    ++sum.shards_up;
    const StatusResponse& s = r.status;
    sum.tensors = std::max(sum.tensors, s.tensors());
    sum.slices += s.slices();
    sum.parameter_bytes += s.parameter_bytes();
    AddCounters(s.counters(), &sum.counters);
    AddRates(s.rates(), &sum.rates);
    const StalenessHistogram& h = s.staleness();
    sum.staleness_p50 = std::max(sum.staleness_p50, h.p50());
    sum.staleness_p90 = std::max(sum.staleness_p90, h.p90());
    sum.staleness_p99 = std::max(sum.staleness_p99, h.p99());
    sum.staleness_max = std::max(sum.staleness_max, h.max());
    policies.insert(DescribePolicy(s.policy()));
    runs.insert(s.run_id());
    maps.insert(s.map().num_slots() == 0
                    ? std::string("static")
                    : absl::StrCat(s.map().num_slots(), " slots, epoch ",
                                   s.map().epoch()));
    sum.tables = std::max(sum.tables, s.tables_size());
    for (const TableStatus& t : s.tables()) {
      sum.table_rows += t.rows();
      sum.table_bytes += t.bytes();
    }
    bool live_here = false;
    for (const WorkerStatus& w : s.workers()) live_here |= w.live();
    if (live_here) {
      sum.min_clock =
          any_clock ? std::min(sum.min_clock, s.min_clock()) : s.min_clock();
      sum.max_clock =
          any_clock ? std::max(sum.max_clock, s.max_clock()) : s.max_clock();
      any_clock = true;
    }
  }
  sum.any_live = any_clock;
  sum.parameters = sum.parameter_bytes / sizeof(float);
  if (runs.size() == 1) {
    sum.run_id = *runs.begin();
  } else if (runs.size() > 1) {
    sum.run_id = absl::StrCat("mixed: ", absl::StrJoin(runs, " | "));
  }
  if (maps.size() == 1) {
    sum.map = *maps.begin();
  } else if (maps.size() > 1) {
    sum.map = absl::StrCat("mixed: ", absl::StrJoin(maps, " | "));
  }
  if (policies.size() == 1) {
    sum.policy = *policies.begin();
  } else if (policies.size() > 1) {
    sum.policy = absl::StrCat("mixed: ", absl::StrJoin(policies, " | "));
  }
  const std::vector<MergedWorker> workers = MergeWorkers(shards);
  sum.workers = static_cast<int>(workers.size());
  for (const MergedWorker& w : workers) sum.live_workers += w.live ? 1 : 0;
  return sum;
}

std::vector<MergedWorker> MergeWorkers(const std::vector<ShardResult>& shards) {
  // Newest incarnation per worker id first.
  std::map<int32_t, uint64_t> newest;
  for (const ShardResult& r : shards) {
    if (!r.up) continue;
    for (const WorkerStatus& w : r.status.workers()) {
      uint64_t& inc = newest[w.worker_id()];
      inc = std::max(inc, w.incarnation());
    }
  }
  std::map<int32_t, MergedWorker> merged;
  for (const ShardResult& r : shards) {
    if (!r.up) continue;
    for (const WorkerStatus& w : r.status.workers()) {
      if (w.incarnation() != newest[w.worker_id()]) continue;
      auto [it, fresh] = merged.try_emplace(w.worker_id());
      MergedWorker& m = it->second;
      if (fresh) {
        m.worker_id = w.worker_id();
        m.incarnation = w.incarnation();
        m.clock = w.clock();
        m.trained = w.trained();
        m.heartbeat_age_ms = w.last_heartbeat_age_ms();
      } else {
        m.clock = std::max(m.clock, w.clock());
        m.trained = std::max(m.trained, w.trained());
        m.heartbeat_age_ms =
            std::min(m.heartbeat_age_ms, w.last_heartbeat_age_ms());
      }
      m.pushes += w.pushes();
      m.live |= w.live();
      m.left |= w.left();
      ++m.shards;
    }
  }
  int64_t fastest = 0;
  bool any_live = false;
  for (auto& [id, m] : merged) {
    if (m.live) {
      m.left = false;
      fastest = any_live ? std::max(fastest, m.clock) : m.clock;
      any_live = true;
    }
  }
  std::vector<MergedWorker> out;
  for (auto& [id, m] : merged) {
    m.lag = m.live ? fastest - m.clock : 0;
    out.push_back(m);
  }
  return out;
}

double MergedTable::imbalance() const {
  if (rows == 0 || shards == 0) return 0;
  return static_cast<double>(max_shard_rows) * shards / rows - 1.0;
}

std::vector<MergedTable> MergeTables(const std::vector<ShardResult>& shards) {
  std::map<std::string, MergedTable> merged;
  for (const ShardResult& r : shards) {
    if (!r.up) continue;
    for (const TableStatus& t : r.status.tables()) {
      MergedTable& m = merged[t.name()];
      m.name = t.name();
      m.dim = t.dim();
      m.optimizer = t.optimizer();
      m.rows += t.rows();
      m.bytes += t.bytes();
      m.rows_created += t.rows_created();
      m.rows_evicted += t.rows_evicted();
      m.pulls += t.pulls();
      m.pushes += t.pushes();
      m.eviction = t.eviction();
      m.admission = t.admission();
      m.rows_evicted_cap += t.rows_evicted_cap();
      m.admission_refused += t.admission_refused();
      m.max_fill_ratio = std::max(m.max_fill_ratio, t.fill_ratio());
      m.max_shard_rows = std::max(m.max_shard_rows, t.rows());
      ++m.shards;
    }
  }
  std::vector<MergedTable> out;
  for (auto& [name, m] : merged) out.push_back(std::move(m));
  return out;
}

namespace {

// The problems, then the cluster's totals, a line per aspect.
std::string SummaryText(const std::vector<ShardResult>& shards) {
  const ClusterSummary s = Summarize(shards);
  const Counters& c = s.counters;
  std::string out;
  for (const std::string& p : Problems(shards)) {
    absl::StrAppend(&out, "WARNING: ", p, "\n");
  }
  absl::StrAppend(
      &out, "cluster: ", s.shards_up, "/", shards.size(), " shards up",
      s.shards_down > s.shards_unheld
          ? absl::StrCat(" (", s.shards_down - s.shards_unheld, " DOWN)")
          : "",
      s.shards_unheld > 0
          ? absl::StrCat(" (", s.shards_unheld, " with no process)")
          : "",
      s.policy.empty() ? "" : absl::StrCat("   policy: ", s.policy),
      s.run_id.empty() ? "" : absl::StrCat("   run: ", s.run_id),
      s.map.empty() || s.map == "static" ? "" : absl::StrCat("   map: ", s.map),
      "\n");
  for (const ShardResult& r : shards) {
    if (r.up && !r.status.slot_move().empty()) {
      absl::StrAppend(&out, "  shard ", r.index, ": ", r.status.slot_move(),
                      "\n");
    }
  }
  absl::StrAppend(&out, "  tensors ", s.tensors, "  slices ", s.slices,
                  "  parameters ", s.parameters, " (",
                  HumanBytes(s.parameter_bytes), ")\n");
  if (s.tables > 0) {
    absl::StrAppend(&out, "  tables ", s.tables, "  rows ", s.table_rows, " (",
                    HumanBytes(s.table_bytes), ")\n");
  }
  absl::StrAppend(&out, "  pushes ", c.pushes(), " (", c.duplicate_pushes(),
                  " duplicate, ", c.steps(), " with the next pull)  pulls ",
                  c.pulls(), "  slice updates ", c.updates_applied(),
                  " applied / ", c.refused_stale(), " refused-stale / ",
                  c.scaled(), " scaled  bad-input ", c.rejected_bad_input(),
                  "\n");
  absl::StrAppend(&out, "  rates: ", Rate(s.rates.pushes_per_s()),
                  " pushes/s  ", Rate(s.rates.pulls_per_s()), " pulls/s  ",
                  Rate(s.rates.updates_per_s()), " updates/s  in ",
                  HumanBytes(s.rates.bytes_in_per_s()), "/s  out ",
                  HumanBytes(s.rates.bytes_out_per_s()), "/s\n");
  absl::StrAppend(&out, "  staleness (worst shard): p50 ", s.staleness_p50,
                  "  p90 ", s.staleness_p90, "  p99 ", s.staleness_p99,
                  "  max ", s.staleness_max, "\n");
  absl::StrAppend(
      &out, "  workers ", s.live_workers, " live / ", s.workers, "  clocks ",
      s.any_live ? absl::StrCat(s.min_clock, "..", s.max_clock)
                 : std::string("- (no live worker)"),
      "  evictions ", c.evictions(), "  pull waits ", c.pull_waits(), " (",
      c.pull_wait_timeouts(), " timed out)\n");
  const std::vector<LearningRate> rates = MergeLearningRates(shards);
  if (!rates.empty()) {
    std::vector<std::string> parts;
    for (const LearningRate& l : rates) {
      parts.push_back(absl::StrCat(l.name(), " ", l.learning_rate(), " (step ",
                                   l.step(), ")"));
    }
    absl::StrAppend(&out, "  learning rates: ", absl::StrJoin(parts, ", "),
                    "\n");
  }
  if (c.checkpoints_written() + c.checkpoints_failed() > 0) {
    absl::StrAppend(&out, "  checkpoints ", c.checkpoints_written(),
                    " written / ", c.checkpoints_failed(),
                    " failed (per shard: psctl status -o wide)\n");
  }
  return out;
}

// The row of one shard that answered, in the columns of ShardsText.
std::vector<std::string> ShardRow(const ShardResult& r, size_t num_shards,
                                  bool wide) {
  const StatusResponse& st = r.status;
  const Counters& sc = st.counters();
  const StalenessHistogram& h = st.staleness();
  std::string index = absl::StrCat(st.shard_index(), "/", st.num_shards());
  // A shard in the wrong place (see Problems) is marked in its row too.
  if (st.shard_index() != r.index ||
      st.num_shards() != static_cast<int32_t>(num_shards)) {
    absl::StrAppend(&index, "!");
  }
  std::vector<std::string> row = {index,
                                  r.address,
                                  "up",
                                  HumanDuration(st.uptime_ms()),
                                  absl::StrCat(st.tensors()),
                                  absl::StrCat(st.slices()),
                                  HumanBytes(st.parameter_bytes()),
                                  absl::StrCat(sc.pushes()),
                                  absl::StrCat(sc.pulls()),
                                  absl::StrCat(sc.updates_applied()),
                                  absl::StrCat(sc.refused_stale()),
                                  absl::StrCat(sc.scaled()),
                                  absl::StrCat(sc.rejected_bad_input()),
                                  absl::StrCat(h.p50()),
                                  absl::StrCat(h.p90()),
                                  absl::StrCat(h.p99()),
                                  absl::StrCat(h.max()),
                                  absl::StrCat(st.workers_size())};
  if (wide) {
    const CheckpointInfo& ck = st.last_checkpoint();
    row.push_back(HumanBytes(st.rates().bytes_in_per_s()));
    row.push_back(HumanBytes(st.rates().bytes_out_per_s()));
    row.push_back(HumanBytes(sc.bytes_in()));
    row.push_back(HumanBytes(sc.bytes_out()));
    row.push_back(st.build_version());
    row.push_back(
        ck.path().empty()
            ? "-"
            : absl::StrCat(ck.path(), " (", HumanBytes(ck.bytes()), ")"));
  }
  return row;
}

// One row per shard (wide: with rates, bytes, version and checkpoint).
std::string ShardsText(const std::vector<ShardResult>& shards, bool wide) {
  std::vector<std::string> header = {
      "SHARD",  "ADDRESS", "STATE", "UPTIME",  "TENSORS", "SLICES",
      "PARAMS", "PUSHES",  "PULLS", "APPLIED", "STALE",   "SCALED",
      "BAD",    "P50",     "P90",   "P99",     "MAX",     "WORKERS"};
  if (wide) {
    for (const char* h : {"IN/S", "OUT/S", "BYTES_IN", "BYTES_OUT", "VERSION",
                          "LAST_CHECKPOINT"}) {
      header.push_back(h);
    }
  }
  TextTable table(std::move(header), /*left_columns=*/3);
  for (size_t i = 0; i < shards.size(); ++i) {
    const ShardResult& r = shards[i];
    if (r.up) {
      table.AddRow(ShardRow(r, shards.size(), wide));
      continue;
    }
    // Groups no process holds, one row per run of them (a run in etcd may
    // declare thousands as room to grow onto).
    size_t last = i;
    while (r.address.empty() && last + 1 < shards.size() &&
           !shards[last + 1].up && shards[last + 1].address.empty() &&
           shards[last + 1].error == r.error) {
      ++last;
    }
    table.AddRow({last == i ? absl::StrCat(r.index)
                            : absl::StrCat(r.index, "-", shards[last].index),
                  r.address, "DOWN", r.error});
    i = last;
  }
  return table.Render();
}

// The sparse tables merged over the shards; "" when there are none.
std::string TablesText(const std::vector<ShardResult>& shards) {
  const std::vector<MergedTable> tables = MergeTables(shards);
  if (tables.empty()) return "";
  TextTable tt(
      {"TABLE", "OPTIMIZER", "DIM", "ROWS", "BYTES", "IMBALANCE", "CREATED",
       "EVICTED", "PULLS", "PUSHES", "POLICY", "FILL", "FILTERED"},
      /*left_columns=*/2);
  // An enum value's name without its prefix, in lower case.
  const auto bare = [](std::string name, absl::string_view prefix) {
    if (absl::StartsWith(name, prefix)) name = name.substr(prefix.size());
    return absl::AsciiStrToLower(name);
  };
  for (const MergedTable& t : tables) {
    tt.AddRow(
        {t.name, bare(OptimizerType_Name(t.optimizer), "OPT_"),
         absl::StrCat(t.dim), absl::StrCat(t.rows), HumanBytes(t.bytes),
         absl::StrFormat("%.1f%%", 100 * t.imbalance()),
         absl::StrCat(t.rows_created), absl::StrCat(t.rows_evicted),
         absl::StrCat(t.pulls), absl::StrCat(t.pushes),
         absl::StrCat(bare(EvictionPolicy_Name(t.eviction), "EVICT_"), "/",
                      bare(AdmissionPolicy_Name(t.admission), "ADMIT_")),
         absl::StrFormat("%.0f%%", 100 * t.max_fill_ratio),
         absl::StrCat(t.admission_refused)});
  }
  return absl::StrCat("\n", tt.Render());
}

// The workers merged over the shards; "" when there are none.
std::string WorkersText(const std::vector<ShardResult>& shards) {
  const std::vector<MergedWorker> workers = MergeWorkers(shards);
  if (workers.empty()) return "";
  TextTable wt({"WORKER", "INCARNATION", "STATE", "CLOCK", "LAG", "TRAINED",
                "HEARTBEAT", "PUSHES", "SHARDS"},
               /*left_columns=*/3);
  for (const MergedWorker& w : workers) {
    // Decimal, as in the shards' logs and the JSON output.
    wt.AddRow({absl::StrCat(w.worker_id), absl::StrCat(w.incarnation),
               w.state(), absl::StrCat(w.clock), absl::StrCat(w.lag),
               absl::StrCat(w.trained),
               absl::StrCat(HumanDuration(w.heartbeat_age_ms), " ago"),
               absl::StrCat(w.pushes), absl::StrCat(w.shards)});
  }
  return absl::StrCat("\n", wt.Render());
}

}  // namespace

// Replicated shards (ps_server --replicas): each group as its primary sees
// it, a row per replica.
std::string ReplicasText(const std::vector<ShardResult>& shards) {
  // LOG KEPT: the bytes (entries) the primary's log keeps for backups that
  // reconnect or lag.
  TextTable rt({"SHARD", "ROLE", "ADDRESS", "MAP EPOCH", "ENTRY", "LAG",
                "COUNTED", "FAILOVERS", "LOG KEPT"},
               /*left_columns=*/3);
  bool any = false;
  for (const ShardResult& r : shards) {
    if (!r.up || !r.status.has_replica()) continue;
    any = true;
    const ReplicaStatus& rs = r.status.replica();
    rt.AddRow({absl::StrCat(r.index), rs.role(), r.address,
               absl::StrCat(rs.map_epoch()), absl::StrCat(rs.log_index()), "0",
               "", absl::StrCat(rs.failovers()),
               absl::StrCat(HumanBytes(rs.log_kept_bytes()), " (",
                            rs.log_kept_entries(), ")")});
    for (const ReplicaStatus::Backup& b : rs.backups()) {
      const uint64_t lag = rs.log_index() - std::min(rs.log_index(), b.acked());
      rt.AddRow({absl::StrCat(r.index), b.caught_up() ? "backup" : "spare",
                 b.address(), "", absl::StrCat(b.acked()), absl::StrCat(lag),
                 b.counted() ? "yes" : "no", "", ""});
    }
  }
  return any ? absl::StrCat("\n", rt.Render()) : "";
}

std::string RenderText(const std::vector<ShardResult>& shards, bool wide) {
  return absl::StrCat(SummaryText(shards), "\n", ShardsText(shards, wide),
                      ReplicasText(shards), TablesText(shards),
                      WorkersText(shards));
}

Doc StatusDoc(const std::vector<ShardResult>& shards) {
  Doc rows = Doc::Array();
  for (const ShardResult& r : shards) {
    Doc row = Doc::Object();
    row.Set("index", Doc::Int(r.index))
        .Set("address", Doc::String(r.address))
        .Set("up", Doc::Bool(r.up));
    if (r.up) {
      // The slot owners (2 bytes a slot) are for routing, not for reading.
      StatusResponse status = r.status;
      status.mutable_map()->clear_owners();
      row.Set("status", DocFromMessage(status));
    } else {
      row.Set("error", Doc::String(r.error));
    }
    rows.Add(std::move(row));
  }
  Doc problems = Doc::Array();
  for (std::string& p : Problems(shards)) problems.Add(Doc::String(p));

  const ClusterSummary s = Summarize(shards);
  const Counters& c = s.counters;
  Doc summary = Doc::Object();
  summary.Set("shards_up", Doc::Int(s.shards_up))
      .Set("shards_down", Doc::Int(s.shards_down))
      .Set("shards_with_no_process", Doc::Int(s.shards_unheld))
      .Set("tensors", Doc::Int(s.tensors))
      .Set("slices", Doc::Int(s.slices))
      .Set("parameters", Doc::Uint(s.parameters))
      .Set("parameter_bytes", Doc::Uint(s.parameter_bytes));
  // Counters and rates under their field names, as in each shard's status.
  summary.Merge(DocFromMessage(c))
      .Merge(DocFromMessage(s.rates))
      .Set("staleness_p50", Doc::Uint(s.staleness_p50))
      .Set("staleness_p90", Doc::Uint(s.staleness_p90))
      .Set("staleness_p99", Doc::Uint(s.staleness_p99))
      .Set("staleness_max", Doc::Uint(s.staleness_max))
      .Set("policy", Doc::String(s.policy))
      .Set("run_id", Doc::String(s.run_id))
      .Set("map", Doc::String(s.map))
      .Set("min_clock", s.any_live ? Doc::Int(s.min_clock) : Doc::Null())
      .Set("max_clock", s.any_live ? Doc::Int(s.max_clock) : Doc::Null())
      .Set("workers", Doc::Int(s.workers))
      .Set("live_workers", Doc::Int(s.live_workers))
      .Set("tables", Doc::Int(s.tables))
      .Set("table_rows", Doc::Uint(s.table_rows))
      .Set("table_bytes", Doc::Uint(s.table_bytes));
  Doc rates = Doc::Object();
  for (const LearningRate& l : MergeLearningRates(shards)) {
    rates.Set(l.name(), DocFromMessage(l));
  }
  summary.Set("learning_rates", std::move(rates));

  Doc workers = Doc::Array();
  for (const MergedWorker& w : MergeWorkers(shards)) {
    Doc row = Doc::Object();
    row.Set("worker_id", Doc::Int(w.worker_id))
        .Set("incarnation", Doc::String(absl::StrCat(w.incarnation)))
        .Set("state", Doc::String(w.state()))
        .Set("clock", Doc::Int(w.clock))
        .Set("lag", Doc::Int(w.lag))
        .Set("trained", Doc::Int(w.trained))
        .Set("heartbeat_age_ms", Doc::Int(w.heartbeat_age_ms))
        .Set("pushes", Doc::Uint(w.pushes))
        .Set("shards", Doc::Int(w.shards));
    workers.Add(std::move(row));
  }
  Doc doc = Doc::Object();
  doc.Set("shards", std::move(rows))
      .Set("problems", std::move(problems))
      .Set("summary", std::move(summary))
      .Set("workers", std::move(workers));
  return doc;
}

std::string RenderJson(const std::vector<ShardResult>& shards) {
  return StatusDoc(shards).Json();
}

}  // namespace asyncps
