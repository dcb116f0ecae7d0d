#!/usr/bin/env bash
# Capped against uncapped shards on the drifting CTR stream: 2 fresh shards
# and one CTR worker train the same data (--ctr_drift_share) once with no
# memory cap, once with --max_parameter_bytes=CAP per shard and table
# eviction (--eviction), and with --admit N once more without a cap but
# with admission after N pushes. A benchmark, not a test.
#
# Per run: wall time and examples/s of the worker; final test AUC; rows
# created as the worker counted them (its pulls' and pushes' answers) and
# as the shards did, rows evicted (under the cap / idle), rows held at the
# end, row gradients the admission filter dropped; row gradients refused
# (stale or read before an eviction, worker's count); calls refused with
# RESOURCE_EXHAUSTED (the worker log's lines); each shard's peak RSS. The
# shards' counts come from `psctl status` before they are stopped.
# Then the ratios the targets name: the uncapped run's rows created are
# the stream's distinct ids (no cap, no admission: one row per id); AUC
# capped / uncapped and admitted / uncapped; each shard's peak RSS over the
# cap; examples/s of the capped run over the uncapped run's while the
# capped tables were below the cap (the worker's progress windows that
# ended before the capped shards' first eviction, sampled by psctl every
# second, against the same windows of the uncapped run); rows created with
# admission / without.
#
#   tests/bench/capped_ctr.sh --cap 64M [--examples N] [--eviction lru]
#                             [--admit N] [--log-every STEPS] [--out DIR]
#                             [-- extra worker flags]
set -euo pipefail
cd "$(dirname "$0")/../.."
cap="" examples=400000 eviction=lru admit=0 log_every=500 out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cap) cap="$2"; shift 2 ;;
    --examples) examples="$2"; shift 2 ;;
    --eviction) eviction="$2"; shift 2 ;;
    --admit) admit="$2"; shift 2 ;;
    --log-every) log_every="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "capped_ctr.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
[ -n "$cap" ] || { echo "capped_ctr.sh: --cap is required" >&2; exit 2; }
ps_server=bazel-bin/server/ps_server ps_worker=bazel-bin/worker/ps_worker
psctl=bazel-bin/tools/psctl
out=${out:-$(mktemp -d)}
mkdir -p "$out"
pids=()
cleanup() {
  for p in "${pids[@]}"; do
    kill -9 "$p" 2>/dev/null || continue
    wait "$p" 2>/dev/null || true  # reaped here: no "Killed" line
  done
}
trap cleanup EXIT
drift=(--ctr_drift_share=0.3 --ctr_drift_window=20000
       --ctr_drift_ids_per_example=1 "$@")

# Sums the EVICTED column of psctl's table section (sixth from the end) of
# the shards $2: one line "<unix time> <rows evicted>" a second into $1
# until killed (or this script is gone).
sample_evictions() {
  while kill -0 $$ 2>/dev/null; do
    local t n
    t=$(date +%s.%N)
    n=$("$psctl" status --servers="$2" 2>/dev/null |
        awk '$1 == "TABLE" { on = 1; next } on && NF == 0 { on = 0 }
             on { s += $(NF - 5) } END { print s + 0 }') || n=""
    [ -n "$n" ] && echo "$t $n" >>"$1"
    sleep 1
  done
}

run() {  # name, server flags..., then -- worker flags...
  local dir="$out/$1"; shift
  local sflags=() wflags=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do sflags+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  wflags=("$@")
  mkdir -p "$dir"
  # A port file of an earlier run in the same --out names a dead port.
  rm -f "$dir"/shard*.port
  pids=()
  for i in 0 1; do
    "$ps_server" --shard_index=$i --num_shards=2 --port=0 \
      --port_file="$dir/shard$i.port" "${sflags[@]}" >"$dir/shard$i.log" 2>&1 &
    pids+=($!)
  done
  local shards=("${pids[@]}") servers=""
  for i in 0 1; do
    for _ in $(seq 100); do [ -s "$dir/shard$i.port" ] && break; sleep 0.1; done
    [ -s "$dir/shard$i.port" ] || { echo "shard $i did not start: $dir" >&2; exit 1; }
    servers+="${servers:+,}127.0.0.1:$(cat "$dir/shard$i.port")"
  done
  sample_evictions "$dir/evictions.txt" "$servers" &
  pids+=($!)
  local t0 t1
  t0=$(date +%s.%N)
  OPENBLAS_NUM_THREADS=1 timeout 900 "$ps_worker" --model=ctr \
    --servers="$servers" --ctr_train_examples="$examples" \
    --ctr_test_examples=50000 --log_every_steps="$log_every" "${drift[@]}" \
    "${wflags[@]}" >"$dir/worker.log" 2>&1 || { echo "worker failed: $dir" >&2; exit 1; }
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }' >"$dir/wall_s"
  "$psctl" status --servers="$servers" -o json >"$dir/status.json"
  for p in "${shards[@]}"; do
    awk '/VmHWM/ { print $2 * 1024 }' /proc/$p/status
  done >"$dir/peak_rss"
  cleanup
}

# Reads every run's files under $out and prints a line per run, then the
# ratios against the uncapped run.
report() {
  python3 - "$out" "$examples" "$log_every" <<'EOF'
import json, os, re, sys, time
out, examples, log_every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
M = 1 << 20

def load(name):
    d = os.path.join(out, name)
    if not os.path.isdir(d):
        return None
    r = {"name": name}
    r["wall"] = float(open(os.path.join(d, "wall_s")).read())
    log = open(os.path.join(d, "worker.log")).read()
    r["auc"] = float(re.search(r"final test auc: ([0-9.]+)", log).group(1))
    m = re.search(r"refused rows (\d+), rows created (\d+)", log)
    r["refused"], r["worker_created"] = int(m.group(1)), int(m.group(2))
    r["exhausted"] = log.count("RESOURCE_EXHAUSTED")
    # Progress windows: (end time, step, examples/s).
    r["windows"] = [
        (time.mktime(time.strptime(ts, "%Y-%m-%d %H:%M:%S")), int(step),
         float(rate))
        for ts, step, rate in re.findall(
            r"^(\S+ \S+) worker \d+ step (\d+)/\d+ .* examples/s ([0-9.]+)",
            log, re.M)]
    st = json.load(open(os.path.join(d, "status.json")))
    tables = [t for s in st["shards"] for t in s["status"].get("tables", [])]
    total = lambda k: sum(int(t.get(k, 0)) for t in tables)
    for k in ("rows", "rows_created", "rows_evicted_cap", "rows_evicted_idle",
              "rows_admitted", "admission_refused"):
        r[k] = total(k)
    r["caps"] = [int(s["status"]["max_parameter_bytes"]) for s in st["shards"]]
    r["table_bytes"] = [sum(int(t.get("bytes", 0))
                            for t in s["status"].get("tables", []))
                        for s in st["shards"]]
    r["rss"] = [int(x) for x in open(os.path.join(d, "peak_rss")).read().split()]
    r["samples"] = [tuple(map(float, l.split()))
                    for l in open(os.path.join(d, "evictions.txt"))]
    return r

def rate(windows, first, last):
    # Examples/s over the progress windows ending at steps first..last
    # (equal windows of log_every steps: total examples over total time).
    w = [x for x in windows if first <= x[1] <= last]
    return len(w) / sum(1 / x[2] for x in w) if w else float("nan")

runs = [r for r in map(load, ("uncapped", "capped", "admit")) if r]
for r in runs:
    print(f"{r['name']}: wall {r['wall']:.1f}s, {examples / r['wall']:.0f} "
          f"examples/s, auc {r['auc']:.4f}, rows created {r['worker_created']} "
          f"(worker) / {r['rows_created']} (shards), evicted under the cap "
          f"{r['rows_evicted_cap']}, idle {r['rows_evicted_idle']}, rows held "
          f"{r['rows']}, admitted {r['rows_admitted']}, filtered gradients "
          f"{r['admission_refused']}, refused row gradients {r['refused']}, "
          f"RESOURCE_EXHAUSTED {r['exhausted']}, shard peak RSS "
          + " ".join(f"{x / M:.0f}M" for x in r["rss"]))
base = runs[0]
print(f"distinct ids (uncapped rows created): {base['rows_created']}")
for r in runs[1:]:
    print(f"{r['name']} / uncapped: auc {r['auc'] / base['auc']:.4f}, rows "
          f"created {r['rows_created'] / base['rows_created']:.3f}")
    if r["name"] != "capped":
        continue
    print(f"capped: rows held / uncapped {r['rows'] / base['rows']:.3f}; "
          "cap / the uncapped run's table bytes per shard: " + ", ".join(
              f"{c / b:.3f}" for c, b in zip(r["caps"], base["table_bytes"])))
    print("capped: peak RSS - cap per shard: " + ", ".join(
        f"{(x - c) / M:.0f}M (cap {c / M:.0f}M)"
        for x, c in zip(r["rss"], r["caps"])))
    # The last sample with no eviction; windows ending a second (the log's
    # resolution) before it were below the cap.
    below = [t for t, n in r["samples"] if n == 0]
    evicting = [t for t, n in r["samples"] if n > 0]
    if not evicting:
        print("capped: never reached the cap")
        last = max(s for _, s, _ in r["windows"])
    else:
        t_free = max(t for t in below if t < min(evicting))
        steps = [s for t, s, _ in r["windows"] if t + 1 <= t_free]
        last = max(steps) if steps else 0
    if last:
        c, u = rate(r["windows"], 1, last), rate(base["windows"], 1, last)
        print(f"capped: below the cap (steps 0..{last}): {c:.0f} examples/s "
              f"vs uncapped {u:.0f} over the same steps: {c / u:.3f}")
    else:
        print("capped: no progress window ended below the cap "
              "(lower --log-every)")
EOF
}

rm -f "$out/summary.txt"
run uncapped
run capped --max_parameter_bytes="$cap" -- --table_eviction="$eviction"
if [ "$admit" != 0 ]; then run admit -- --table_admit_count="$admit"; fi
report | tee "$out/summary.txt"
echo "logs: $out"
