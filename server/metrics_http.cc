#include "server/metrics_http.h"

#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace asyncps {

namespace {

// Label values escape backslash, double quote and newline (format 0.0.4).
std::string EscapeLabelValue(absl::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// Seconds with millisecond resolution, as Prometheus parses floats.
std::string Seconds(int64_t ms) {
  return absl::StrFormat("%.3f", static_cast<double>(ms) / 1000.0);
}

// Accumulates the exposition text. Every family gets # HELP and # TYPE once,
// followed by its samples; all samples carry the shard label.
class Exposition {
 public:
  explicit Exposition(int shard)
      : shard_label_(absl::StrCat("shard=\"", shard, "\"")) {}

  void Family(absl::string_view name, absl::string_view type,
              absl::string_view help) {
    absl::StrAppend(&out_, "# HELP ", name, " ", help, "\n# TYPE ", name, " ",
                    type, "\n");
  }

  // `labels` are extra, already formatted `k="v"` pairs, comma-separated.
  void Sample(absl::string_view name, absl::string_view value,
              absl::string_view labels = "") {
    absl::StrAppend(&out_, name, "{", shard_label_, labels.empty() ? "" : ",",
                    labels, "} ", value, "\n");
  }

  void Single(absl::string_view name, absl::string_view type,
              absl::string_view help, absl::string_view value) {
    Family(name, type, help);
    Sample(name, value);
  }

  std::string Take() { return std::move(out_); }

 private:
  const std::string shard_label_;
  std::string out_;
};

// The shard's counters (Counters).
void AppendCounters(const Counters& c, Exposition* out) {
  Exposition& e = *out;
  auto counter = [&e](absl::string_view name, absl::string_view help,
                      uint64_t v) {
    e.Single(name, "counter", help, absl::StrCat(v));
  };
  counter("asyncps_pulls_total", "Pull RPCs answered.", c.pulls());
  counter("asyncps_pushes_total",
          "Push RPCs accepted, duplicates (retries) included.", c.pushes());
  counter("asyncps_duplicate_pushes_total",
          "Push RPCs recognised as retries of an applied push.",
          c.duplicate_pushes());
  counter("asyncps_slice_updates_applied_total",
          "Slice gradients applied to the parameters.", c.updates_applied());
  counter("asyncps_slice_updates_refused_stale_total",
          "Slice gradients refused as staler than --max_staleness.",
          c.refused_stale());
  counter("asyncps_slice_updates_scaled_total",
          "Slice gradients applied with a learning rate scaled below 1.",
          c.scaled());
  counter("asyncps_requests_rejected_total",
          "Requests rejected as invalid input.", c.rejected_bad_input());
  counter("asyncps_bytes_received_total", "Gradient payload bytes received.",
          c.bytes_in());
  counter("asyncps_bytes_sent_total", "Parameter payload bytes sent.",
          c.bytes_out());
  counter("asyncps_worker_evictions_total",
          "Workers evicted after their lease expired.", c.evictions());
  counter("asyncps_steps_total",
          "Pushes that came with the next step's pull (StepStream).",
          c.steps());
  counter("asyncps_pull_waits_total",
          "Pulls that waited for slower workers (SSP/BSP).", c.pull_waits());
  counter("asyncps_pull_wait_timeouts_total",
          "Pulls whose wait for slower workers timed out.",
          c.pull_wait_timeouts());
  counter("asyncps_checkpoints_written_total",
          "Checkpoints written (requested, periodic and at shutdown).",
          c.checkpoints_written());
  counter("asyncps_checkpoints_failed_total", "Checkpoint writes that failed.",
          c.checkpoints_failed());
  counter("asyncps_misrouted_calls_total",
          "Pulls and pushes refused for the shard map they were routed with, "
          "or while this shard's slots moved out.",
          c.misrouted_calls());
}

// The replica's place in its group (ps_server --replicas).
void AppendReplica(const ReplicaStatus& r, Exposition* out) {
  Exposition& e = *out;
  e.Single("asyncps_replica_primary", "gauge",
           "1 while this process is its shard's primary.",
           r.role() == "primary" ? "1" : "0");
  e.Single("asyncps_replica_map_epoch", "gauge",
           "Epoch of the shard map as this process last read it.",
           absl::StrCat(r.map_epoch()));
  e.Single("asyncps_replica_log_index", "gauge",
           "The replica's last entry (primary: run; backup: applied).",
           absl::StrCat(r.log_index()));
  e.Single("asyncps_replica_failovers_total", "counter",
           "Times this process took over as its shard's primary.",
           absl::StrCat(r.failovers()));
  e.Single("asyncps_replica_acked_steps_total", "counter",
           "Steps whose answers waited for the backups.",
           absl::StrCat(r.acked_steps()));
  e.Single("asyncps_replica_ack_wait_seconds_total", "counter",
           "Time answers waited for the backups (replication latency).",
           Seconds(r.ack_wait_us_total() / 1000));
  e.Single("asyncps_replica_snapshots_sent_total", "counter",
           "Snapshots sent to spares catching up.",
           absl::StrCat(r.snapshots_sent()));
  e.Single("asyncps_replica_snapshot_bytes_sent_total", "counter",
           "Bytes of snapshots sent to spares catching up.",
           absl::StrCat(r.snapshot_bytes_sent()));
  e.Single("asyncps_replica_log_bytes", "gauge",
           "Bytes of the entries the replica's log keeps for backups that "
           "reconnect or lag.",
           absl::StrCat(r.log_kept_bytes()));
  e.Family("asyncps_replica_backup_lag_entries", "gauge",
           "Entries the primary ran that a backup has not acknowledged.");
  for (const ReplicaStatus::Backup& b : r.backups()) {
    e.Sample("asyncps_replica_backup_lag_entries",
             absl::StrCat(r.log_index() - std::min(r.log_index(), b.acked())),
             absl::StrCat("backup=\"", EscapeLabelValue(b.address()), "\""));
  }
}

// What the shard is, holds and sees: build, policy, sizes, clocks.
void AppendGauges(const StatusResponse& s, Exposition* out) {
  Exposition& e = *out;
  const StalenessPolicy& p = s.policy();
  e.Family("asyncps_build_info", "gauge",
           "Constant 1, labelled with the version and consistency policy.");
  e.Sample("asyncps_build_info", "1",
           absl::StrCat("version=\"", EscapeLabelValue(s.build_version()),
                        "\",consistency=\"",
                        EscapeLabelValue(Consistency_Name(p.consistency())),
                        "\",staleness_lr=\"",
                        EscapeLabelValue(p.staleness_lr()), "\""));
  auto gauge = [&e](absl::string_view name, absl::string_view help,
                    absl::string_view v) { e.Single(name, "gauge", help, v); };
  gauge("asyncps_shards", "Shards in the cluster.",
        absl::StrCat(s.num_shards()));
  gauge("asyncps_max_staleness_bound",
        "Staleness past which slice gradients are refused; -1 = unbounded.",
        absl::StrCat(p.max_staleness()));
  gauge("asyncps_uptime_seconds", "Seconds since the shard started.",
        Seconds(s.uptime_ms()));
  if (!s.last_checkpoint().path().empty()) {
    gauge("asyncps_last_checkpoint_timestamp_seconds",
          "Unix time at which the last checkpoint was started.",
          Seconds(s.last_checkpoint().unix_time_ms()));
    gauge("asyncps_last_checkpoint_bytes", "Size of the last checkpoint.",
          absl::StrCat(s.last_checkpoint().bytes()));
  }
  gauge("asyncps_tensors", "Tensors known to the shard.",
        absl::StrCat(s.tensors()));
  gauge("asyncps_slices", "Tensor slices held by the shard.",
        absl::StrCat(s.slices()));
  gauge("asyncps_parameters_bytes", "Bytes of parameters held by the shard.",
        absl::StrCat(s.parameter_bytes()));
  gauge("asyncps_max_parameter_bytes",
        "The shard's memory cap for tensors and table rows "
        "(--max_parameter_bytes; auto: 40% of the memory it may use, its "
        "cgroup's limit when lower).",
        absl::StrCat(s.max_parameter_bytes()));
  gauge("asyncps_reserved_parameter_bytes",
        "Bytes of the cap taken by tensors and table rows (values, optimizer "
        "state, bookkeeping).",
        absl::StrCat(s.reserved_parameter_bytes()));
  gauge("asyncps_min_clock", "Clock of the slowest live worker.",
        absl::StrCat(s.min_clock()));
  gauge("asyncps_max_clock", "Clock of the fastest live worker.",
        absl::StrCat(s.max_clock()));
  int live = 0;
  for (const WorkerStatus& w : s.workers()) live += w.live() ? 1 : 0;
  gauge("asyncps_live_workers", "Workers currently holding a lease.",
        absl::StrCat(live));
  if (s.has_replica()) AppendReplica(s.replica(), out);
}

// The staleness histogram. Bucket i of the proto counts values in
// [upper_bounds(i-1), upper_bounds(i)); staleness is an integer, so the
// inclusive Prometheus bound of bucket i is upper_bounds(i) - 1.
void AppendStaleness(const StalenessHistogram& h, Exposition* out) {
  Exposition& e = *out;
  constexpr absl::string_view kHist = "asyncps_push_staleness";
  e.Family(kHist, "histogram",
           "Staleness (updates between read and apply) of pushed slice "
           "gradients, applied or refused.");
  const int buckets = std::min(h.upper_bounds_size(), h.counts_size());
  const uint64_t kInf = std::numeric_limits<int64_t>::max();
  uint64_t cumulative = 0;
  bool saw_inf = false;
  for (int i = 0; i < buckets; ++i) {
    cumulative += h.counts(i);
    const uint64_t bound = h.upper_bounds(i);
    if (bound == 0) continue;  // an empty bucket below 0 cannot exist
    saw_inf = bound >= kInf;
    const std::string le = saw_inf ? "+Inf" : absl::StrCat(bound - 1);
    e.Sample("asyncps_push_staleness_bucket", absl::StrCat(cumulative),
             absl::StrCat("le=\"", le, "\""));
    if (saw_inf) break;
  }
  if (!saw_inf) {
    e.Sample("asyncps_push_staleness_bucket", absl::StrCat(cumulative),
             "le=\"+Inf\"");
  }
  e.Sample("asyncps_push_staleness_sum", absl::StrCat(h.sum()));
  e.Sample("asyncps_push_staleness_count", absl::StrCat(cumulative));
}

// One sample per worker of each per-worker family.
void AppendWorkers(const StatusResponse& s, Exposition* out) {
  if (s.workers_size() == 0) return;
  Exposition& e = *out;
  auto per_worker = [&](absl::string_view name, absl::string_view type,
                        absl::string_view help, auto value) {
    e.Family(name, type, help);
    for (const WorkerStatus& w : s.workers()) {
      e.Sample(name, value(w), absl::StrCat("worker=\"", w.worker_id(), "\""));
    }
  };
  per_worker("asyncps_worker_clock", "gauge",
             "Steps the worker has completed, as this shard last heard.",
             [](const WorkerStatus& w) { return absl::StrCat(w.clock()); });
  per_worker("asyncps_worker_trained", "gauge",
             "The worker's data position: steps of its share whose pushes "
             "every shard acknowledged.",
             [](const WorkerStatus& w) { return absl::StrCat(w.trained()); });
  per_worker("asyncps_worker_lag", "gauge",
             "Fastest live worker's clock minus this worker's (0 when not "
             "live).",
             [](const WorkerStatus& w) { return absl::StrCat(w.lag()); });
  per_worker(
      "asyncps_worker_live", "gauge",
      "1 while the worker holds a lease, else 0.",
      [](const WorkerStatus& w) { return std::string(w.live() ? "1" : "0"); });
  per_worker(
      "asyncps_worker_heartbeat_age_seconds", "gauge",
      "Seconds since the shard last heard from the worker.",
      [](const WorkerStatus& w) { return Seconds(w.last_heartbeat_age_ms()); });
  per_worker("asyncps_worker_pushes_total", "counter",
             "Pushes applied from the worker's current incarnation.",
             [](const WorkerStatus& w) { return absl::StrCat(w.pushes()); });
}

// One sample per sparse table of each per-table family.
void AppendTables(const StatusResponse& s, Exposition* out) {
  if (s.tables_size() == 0) return;
  Exposition& e = *out;
  auto per_table = [&](absl::string_view name, absl::string_view type,
                       absl::string_view help, auto value) {
    e.Family(name, type, help);
    for (const TableStatus& t : s.tables()) {
      e.Sample(name, absl::StrCat(value(t)),
               absl::StrCat("table=\"", EscapeLabelValue(t.name()), "\""));
    }
  };
  per_table("asyncps_table_rows", "gauge",
            "Rows of the sparse table held by the shard.",
            [](const TableStatus& t) { return t.rows(); });
  per_table("asyncps_table_bytes", "gauge",
            "Bytes the table's rows count against --max_parameter_bytes.",
            [](const TableStatus& t) { return t.bytes(); });
  per_table("asyncps_table_rows_created_total", "counter",
            "Rows created on first touch.",
            [](const TableStatus& t) { return t.rows_created(); });
  per_table("asyncps_table_rows_evicted_total", "counter",
            "Rows evicted after --row_ttl_steps unused, or under the cap.",
            [](const TableStatus& t) { return t.rows_evicted(); });
  per_table("asyncps_table_rows_evicted_idle_total", "counter",
            "Rows evicted after --row_ttl_steps unused.",
            [](const TableStatus& t) { return t.rows_evicted_idle(); });
  per_table("asyncps_table_rows_evicted_cap_total", "counter",
            "Rows evicted to make room under --max_parameter_bytes.",
            [](const TableStatus& t) { return t.rows_evicted_cap(); });
  per_table("asyncps_table_rows_admitted_total", "counter",
            "Rows created by the table's admission filter.",
            [](const TableStatus& t) { return t.rows_admitted(); });
  per_table("asyncps_table_admission_refused_total", "counter",
            "Gradients of ids without a row dropped by the admission filter.",
            [](const TableStatus& t) { return t.admission_refused(); });
  per_table("asyncps_table_fill_ratio", "gauge",
            "The table's bytes over its bytes plus what is free under "
            "--max_parameter_bytes (0 without a cap).",
            [](const TableStatus& t) { return t.fill_ratio(); });
  per_table("asyncps_table_pulls_total", "counter",
            "Pulls that read rows of the table.",
            [](const TableStatus& t) { return t.pulls(); });
  per_table("asyncps_table_pushes_total", "counter",
            "Pushes applied to rows of the table.",
            [](const TableStatus& t) { return t.pushes(); });
  per_table("asyncps_table_rows_pulled_total", "counter", "Rows read by pulls.",
            [](const TableStatus& t) { return t.rows_pulled(); });
  per_table("asyncps_table_rows_pushed_total", "counter",
            "Distinct rows of applied pushes.",
            [](const TableStatus& t) { return t.rows_pushed(); });
}

// The shard map it serves; with slots, how many it owns and the push bytes
// of its hottest slot (StatusResponse.slot_load: a hot spot psctl
// rebalance can move).
void AppendMap(const StatusResponse& s, Exposition* out) {
  Exposition& e = *out;
  const ShardMapProto& m = s.map();
  e.Single("asyncps_map_epoch", "gauge",
           "Epoch of the shard map this shard serves.",
           absl::StrCat(m.epoch()));
  if (m.num_slots() == 0) return;
  int owned = 0;
  for (size_t i = 0; i + 1 < m.owners().size(); i += 2) {
    const int owner = static_cast<uint8_t>(m.owners()[i]) |
                      static_cast<uint8_t>(m.owners()[i + 1]) << 8;
    owned += owner == s.shard_index() ? 1 : 0;
  }
  uint64_t hottest = 0;
  for (const SlotLoad& l : s.slot_load()) {
    hottest = std::max<uint64_t>(hottest, l.push_bytes());
  }
  e.Single("asyncps_map_slots", "gauge", "Slots of the run's shard map.",
           absl::StrCat(m.num_slots()));
  e.Single("asyncps_map_slots_owned", "gauge",
           "Slots of the shard map this shard owns.", absl::StrCat(owned));
  e.Single("asyncps_drained", "gauge",
           "1 once live moves gave every slot of this process away.",
           s.drained() ? "1" : "0");
  e.Single("asyncps_slot_push_bytes_max", "gauge",
           "Gradient bytes pushed into this shard's busiest slot since it "
           "started.",
           absl::StrCat(hottest));
}

}  // namespace

std::string RenderPrometheus(const StatusResponse& s) {
  Exposition e(s.shard_index());
  AppendCounters(s.counters(), &e);
  AppendGauges(s, &e);
  AppendStaleness(s.staleness(), &e);
  AppendWorkers(s, &e);
  AppendTables(s, &e);
  AppendMap(s, &e);
  return e.Take();
}

MetricsHttpServer::MetricsHttpServer(StatusSource source, TextSource extra)
    : source_(std::move(source)),
      extra_(std::move(extra)),
      // Each scrape on a thread of its own (up to 512 connections, none
      // open longer than a minute), so idle or slow ones hold no other.
      listener_("metrics", HttpConnectionLimits{},
                [this](httplib::Server* server) {
                  server->Get("/metrics", [this](const httplib::Request&,
                                                 httplib::Response& res) {
                    std::string text = RenderPrometheus(source_());
                    if (extra_) text += extra_();
                    res.set_content(std::move(text), kPrometheusContentType);
                  });
                  server->Get(
                      "/", [](const httplib::Request&, httplib::Response& res) {
                        res.set_content("asyncps shard: metrics at /metrics\n",
                                        "text/plain");
                      });
                }) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

absl::StatusOr<int> MetricsHttpServer::Start(const std::string& host,
                                             int port) {
  return listener_.Start(host, port);
}

void MetricsHttpServer::Stop() { listener_.Stop(); }

}  // namespace asyncps
