#include "tools/map_commands.h"

#include <signal.h>

#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/map_change.h"
#include "common/net.h"
#include "common/shard_map_proto.h"
#include "server/file_system.h"
#include "server/reshard.h"
#include "tools/scale_plan.h"
#include "tools/slot_balance.h"

namespace asyncps {

namespace {

absl::StatusOr<ShardMap> ReadMapFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<ShardMap> map = ShardMapFromText(text.str());
  if (!map.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", map.status().message()));
  }
  return map;
}

absl::Status WriteMapFile(const std::string& path, const ShardMap& map) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << ShardMapToText(map);
    out.close();
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

// A Status request for the per-slot load.
StatusRequest LoadRequest() {
  StatusRequest request;
  request.set_slot_load(true);
  return request;
}

// The load a slot carries by --by.
uint64_t LoadOf(const SlotLoad& l, const std::string& by) {
  if (by == "updates") return l.updates();
  if (by == "rows") return l.rows_pushed();
  return l.push_bytes();
}

}  // namespace

int RunReshard(const ReshardFlags& f, Format format) {
  if (f.from.empty() || f.to.empty() || f.shards < 1 || f.slots < 0) {
    return UsageError(
        "reshard needs --from, --to and --shards >= 1 (and --slots >= 0)");
  }
  ReshardOptions options;
  options.from_dir = f.from;
  options.to_dir = f.to;
  options.num_shards = f.shards;
  options.num_slots = f.slots;
  options.fs = FileSystem::Default();  // the POSIX file system
  if (!f.map_file.empty()) {
    absl::StatusOr<ShardMap> map = ReadMapFile(f.map_file);
    if (!map.ok()) return UsageError(std::string(map.status().message()));
    options.map = *std::move(map);
  }
  absl::StatusOr<ReshardReport> r = Reshard(options);
  if (!r.ok()) {
    std::fprintf(stderr, "psctl: reshard: %s\n", r.status().ToString().c_str());
    return absl::IsInvalidArgument(r.status()) ? kExitUsage : kExitDown;
  }
  if (format == Format::kJson || format == Format::kYaml) {
    Doc files = Doc::Array();
    for (const std::string& file : r->written) files.Add(Doc::String(file));
    Doc doc = Doc::Object();
    doc.Set("run_id", Doc::String(r->run_id))
        .Set("from_shards", Doc::Int(r->from_shards))
        .Set("to_shards", Doc::Int(r->to_shards))
        .Set("tensors", Doc::Int(r->tensors))
        .Set("tables", Doc::Int(r->tables))
        .Set("slices", Doc::Int(r->slices))
        .Set("rows", Doc::Int(r->rows))
        .Set("workers", Doc::Int(r->workers))
        .Set("written", std::move(files));
    Print(Render(doc, format));
    return 0;
  }
  Print(absl::StrCat(
      "resharded run '", r->run_id, "' from ", r->from_shards, " to ",
      r->to_shards, " shards: ", r->tensors, " tensors (", r->slices,
      " slices), ", r->tables, " tables (", r->rows, " rows), ", r->workers,
      " worker records\n", absl::StrJoin(r->written, "\n"), "\nstart the ",
      r->to_shards, " shards with --num_shards=", r->to_shards,
      " --checkpoint_dir=", f.to, " (and the same --run_id)\n"));
  return 0;
}

namespace {

// The load of every slot by --by, summed over the shards (a slot that
// moved has counts on both); with `previous` (the last reading's totals,
// updated here), only what was added since.
std::vector<uint64_t> SlotLoads(const std::vector<ShardResult>& results,
                                const ShardMap& map, const std::string& by,
                                std::vector<uint64_t>* previous) {
  std::vector<uint64_t> load(static_cast<size_t>(map.num_slots()), 0);
  for (const ShardResult& r : results) {
    for (const SlotLoad& l : r.status.slot_load()) {
      if (l.slot() < load.size()) load[l.slot()] += LoadOf(l, by);
    }
  }
  if (previous == nullptr) return load;
  std::vector<uint64_t> added = load;
  if (previous->size() == load.size()) {
    for (size_t s = 0; s < load.size(); ++s) {
      // A shard restarted (its counters start again): all of it is new.
      if (load[s] >= (*previous)[s]) added[s] = load[s] - (*previous)[s];
    }
  }
  *previous = std::move(load);
  return added;
}

int Rebalance(ShardQuery* query, absl::Duration timeout,
              const RebalanceFlags& f, const LiveMoveOptions& live,
              std::vector<uint64_t>* previous) {
  const Format format = live.format;
  if ((f.out.empty() && !f.apply) || !(f.threshold >= 1) || f.max_moves < 0 ||
      (f.by != "bytes" && f.by != "updates" && f.by != "rows")) {
    return UsageError(
        "rebalance needs --out=FILE or --apply, --threshold >= 1 and --by "
        "bytes, updates or rows");
  }
  const std::vector<ShardResult> results =
      query->Status(timeout, LoadRequest());
  int code = kExitDown;
  absl::StatusOr<ShardMap> map = NewestMap(results, &code);
  absl::StatusOr<BalancePlan> plan = absl::UnknownError("no map");
  if (!map.ok()) {
    plan = map.status();
  } else {
    plan = PlanBalance(*map, SlotLoads(results, *map, f.by, previous),
                       f.threshold, f.max_moves);
  }
  absl::Status written = plan.status();
  if (plan.ok() && !f.out.empty()) written = WriteMapFile(f.out, plan->map);
  if (!written.ok()) {
    std::fprintf(stderr, "psctl: rebalance: %s\n",
                 std::string(written.message()).c_str());
    return code;
  }
  if (format == Format::kJson || format == Format::kYaml) {
    Doc shards = Doc::Array(), before = Doc::Array(), after = Doc::Array();
    for (const int s : plan->shards) shards.Add(Doc::Int(s));
    for (const uint64_t b : plan->before) before.Add(Doc::Uint(b));
    for (const uint64_t a : plan->after) after.Add(Doc::Uint(a));
    Doc doc = Doc::Object();
    doc.Set("by", Doc::String(f.by))
        .Set("epoch", Doc::Uint(plan->map.epoch()))
        .Set("moved_slots", Doc::Int(plan->moved_slots))
        .Set("shards", std::move(shards))
        .Set("before", std::move(before))
        .Set("after", std::move(after))
        .Set("imbalance_before", Doc::Double(Imbalance(plan->before)))
        .Set("imbalance_after", Doc::Double(Imbalance(plan->after)))
        .Set("out", Doc::String(f.out));
    Print(Render(doc, format));
    return f.apply ? RunLiveMoves(live, *map, plan->map) : 0;
  }
  std::string out =
      absl::StrFormat("%-6s %16s %16s\n", "SHARD", "LOAD_BEFORE", "LOAD_AFTER");
  for (size_t i = 0; i < plan->shards.size(); ++i) {
    absl::StrAppendFormat(&out, "%-6d %16d %16d\n", plan->shards[i],
                          plan->before[i], plan->after[i]);
  }
  absl::StrAppendFormat(
      &out,
      "by %s: busiest / mean %.3f -> %.3f, %d slots move (hottest slot %d "
      "carries %d); map epoch %d",
      f.by, Imbalance(plan->before), Imbalance(plan->after), plan->moved_slots,
      plan->hottest_slot, plan->hottest_slot_load, plan->map.epoch());
  if (!f.out.empty()) absl::StrAppend(&out, " written to ", f.out);
  if (!f.apply) {
    absl::StrAppendFormat(
        &out,
        "\nmove the slots now: psctl rebalance --apply (same flags); or "
        "apply it to the stopped run: psctl reshard --from=DIR --to=NEW_DIR "
        "--shards=%d --map=%s",
        plan->map.num_shards(), f.out.empty() ? "MAP_FILE" : f.out);
  }
  Print(absl::StrCat(out, "\n"));
  return f.apply ? RunLiveMoves(live, *map, plan->map) : 0;
}

}  // namespace

int RunRebalance(ShardQuery* query, absl::Duration timeout,
                 const RebalanceFlags& f, const LiveMoveOptions& live) {
  return Rebalance(query, timeout, f, live, nullptr);
}

int RunRebalanceEvery(ShardQuery* query, absl::Duration timeout,
                      const RebalanceFlags& f, const LiveMoveOptions& live,
                      absl::Duration every) {
  if (!f.apply) return UsageError("rebalance --watch needs --apply");
  // Blocked here too (a no-op after main's), taken between rounds.
  const sigset_t stop = BlockStopSignals();
  std::vector<uint64_t> previous;
  // The first reading only sets the baseline: the load of the last
  // interval is what is planned from.
  {
    const std::vector<ShardResult> results =
        query->Status(timeout, LoadRequest());
    int code = kExitDown;
    absl::StatusOr<ShardMap> map = NewestMap(results, &code);
    if (map.ok() && map->slotted()) {
      SlotLoads(results, *map, f.by, &previous);
    }
  }
  for (;;) {
    const timespec wait = absl::ToTimespec(every);
    siginfo_t info;
    const int sig = sigtimedwait(&stop, &info, &wait);
    if (sig == SIGINT || sig == SIGTERM) return 0;
    const int code = Rebalance(query, timeout, f, live, &previous);
    if (code == kExitUsage) return code;
  }
}

int RunAdoptNewest(ShardQuery* query, absl::Duration timeout,
                   const LiveMoveOptions& live) {
  int code = kExitDown;
  absl::StatusOr<ShardMap> map = NewestMap(query->Status(timeout), &code);
  if (!map.ok()) {
    std::fprintf(stderr, "psctl: adopt: %s\n",
                 std::string(map.status().message()).c_str());
    return code;
  }
  if (code == kExitUsage) {
    return UsageError("a static map does not change (ps_server --num_slots)");
  }
  const int adopted = RunAdopt(live, *map);
  if (!live.remake_lost) return adopted;
  // What --remake_lost lost, said where the operator looks.
  for (const ShardResult& r : query->Status(timeout)) {
    if (!r.up || r.status.slices_remade() == 0) continue;
    std::fprintf(stderr,
                 "psctl: warning: shard %d (%s) made %llu slices anew (their "
                 "updates are lost)\n",
                 r.index, r.address.c_str(),
                 static_cast<unsigned long long>(r.status.slices_remade()));
  }
  return adopted;
}

int RunMove(ShardQuery* query, absl::Duration timeout,
            const std::string& slot_list, int to_shard,
            const LiveMoveOptions& live) {
  absl::StatusOr<std::vector<uint32_t>> slots = ParseSlotList(slot_list);
  if (!slots.ok()) {
    return UsageError(
        absl::StrCat("move needs --slot_list: ", slots.status().message()));
  }
  const std::vector<ShardResult> results = query->Status(timeout);
  int code = kExitDown;
  absl::StatusOr<ShardMap> map = NewestMap(results, &code);
  absl::StatusOr<ShardMap> target = absl::UnknownError("no map");
  if (!map.ok()) target = map.status();
  if (map.ok()) {
    if (code == kExitUsage) {
      return UsageError(absl::StrCat(
          "slots move only in a slotted run (ps_server --num_slots); this "
          "one serves the ",
          map->DebugString()));
    }
    if (to_shard < 0 || to_shard >= map->num_shards()) {
      return UsageError(absl::StrCat("move needs --to_shard in [0, ",
                                     map->num_shards(), ")"));
    }
    target = WithSlotsMoved(*map, *slots, to_shard);
    if (!target.ok()) return UsageError(std::string(target.status().message()));
  }
  if (!target.ok()) {
    std::fprintf(stderr, "psctl: move: %s\n",
                 std::string(target.status().message()).c_str());
    return code;
  }
  return RunLiveMoves(live, *map, *target);
}

int RunScale(ShardQuery* query, absl::Duration timeout, int shards,
             const LiveMoveOptions& live) {
  if (shards < 1) {
    return UsageError(absl::StrCat(
        "scale needs --shards >= 1 (a run keeps at least one shard), got ",
        shards));
  }
  const std::vector<ShardResult> results = query->Status(timeout);
  int code = kExitDown;
  absl::StatusOr<ShardMap> map = NewestMap(results, &code);
  if (map.ok() && code == kExitUsage) {
    return UsageError(std::string(PlanScale(*map, shards).status().message()));
  }
  for (const ShardResult& r : results) {
    if (!map.ok() || r.up || r.index >= shards) continue;
    map = absl::UnavailableError(
        r.address.empty()
            ? absl::StrCat(
                  "shard ", r.index,
                  " has no process: start ps_server --shard_index=", r.index,
                  " with the run's etcd flags before the slots move "
                  "to it")
            : absl::StrCat("shard ", r.index, " (", r.address,
                           ") does not answer: start it before the slots move "
                           "to it (",
                           r.error, ")"));
  }
  if (!map.ok()) {
    std::fprintf(stderr, "psctl: scale: %s\n",
                 std::string(map.status().message()).c_str());
    return code;
  }
  absl::StatusOr<ShardMap> target = PlanScale(*map, shards);
  if (!target.ok()) return UsageError(std::string(target.status().message()));
  code = RunLiveMoves(live, *map, *target);
  if (code == 0 && shards < map->num_shards() &&
      live.format == Format::kTable) {
    Print(absl::StrCat("shards ", shards, "-", map->num_shards() - 1,
                       " own no slot: they may be stopped\n"));
  }
  return code;
}

namespace {

// The shards to spread the slots over now (see RunScaleFollow), or 0 when
// the run should stay as it is.
int WantedShards(ShardQuery* query, absl::Duration timeout) {
  const std::vector<ShardResult> results = query->Status(timeout);
  int code = kExitDown;
  absl::StatusOr<ShardMap> map = NewestMap(results, &code);
  if (!map.ok() || code == kExitUsage) return 0;
  int wanted = 0;
  while (wanted < static_cast<int>(results.size()) && results[wanted].up &&
         !results[wanted].status.drained()) {
    ++wanted;
  }
  const int serving = static_cast<int>(map->serving_shards().size());
  // Only growth, and only onto shards 0..wanted-1 once every one of them
  // answers: the plan keeps the slots on a prefix.
  return wanted > serving ? wanted : 0;
}

}  // namespace

int RunScaleFollow(ShardQuery* query, absl::Duration timeout,
                   const LiveMoveOptions& live, absl::Duration every) {
  const sigset_t stop = BlockStopSignals();
  for (;;) {
    const int wanted = WantedShards(query, timeout);
    if (wanted > 0) {
      Print(absl::StrCat("scale to ", wanted, " shards:\n"));
      RunScale(query, timeout, wanted, live);
    }
    const timespec wait = absl::ToTimespec(every);
    siginfo_t info;
    const int sig = sigtimedwait(&stop, &info, &wait);
    if (sig == SIGINT || sig == SIGTERM) return 0;
  }
}

}  // namespace asyncps
