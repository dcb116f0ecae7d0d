#!/usr/bin/env bash
# The serving study: how the batch wait trades latency for throughput.
# ps_serve serves the Fashion-MNIST MLP (784-256-128-10 unless --hidden says
# otherwise, trained here for one epoch into a checkpoint) and
# tests/bench/serve_load drives it with open-loop Poisson load (many
# connections, a fixed request count, a deadline per request) under these
# policies:
#   none     --max_batch_size=1 (every request computed alone)
#   t50 t200 t1000 t5000   --batch_timeout_us=N (max_batch_size 64)
#   auto     --batch_timeout_us=auto
#   auto_slo --batch_timeout_us=auto --latency_slo_ms=N (with --slo_ms N)
# First each policy's saturation throughput (load far above capacity), then
# every policy at 10%..120% of the highest saturation rate measured, each
# rate first offered for a quarter of its measuring time unmeasured, so that
# a point measures that rate, not the change from the one before.
#
# Writes OUTDIR/study.csv (one row per policy and rate), OUTDIR/summary.csv
# (saturation per policy), OUTDIR/auto_vs_fixed.csv (per rate: the best
# fixed wait's mean latency, auto's, their ratio, which fixed waits are
# within 10% of the best, and how far one policy's rounds lie apart: the
# median over the policies of their max / min round), OUTDIR/latency.png
# (mean and p99 latency against the offered rate, one curve per policy;
# needs gnuplot) and the logs, and prints the figures.
#
#   tests/bench/serving_study.sh OUTDIR [--tiny] [--hidden 1024,1024] [--slo_ms 10] [--rounds 3]
#
# --tiny: few requests per point (seconds, for the test of this script).
# --hidden: the MLP's hidden layer sizes (ps_worker --hidden; 256,128): how
# much batching gains depends on how much a row costs to compute.
# --rounds: measures every policy at every rate that many times, the
# policies in turn within each round (a run of this machine's load hits
# them alike), and reports each point's median round (OUTDIR/rounds.csv
# has them all); near saturation one run's mean latency can differ from the
# next one's several times over.
# --slo_ms: also runs auto with that p99 objective (auto_slo) and writes
# OUTDIR/slo.csv: its p99 at every rate up to 80% of saturation against the
# objective.
# ASYNCPS_BIN=DIR uses prebuilt binaries (flat or in Bazel's layout) instead
# of building them. A benchmark, not a test: numbers depend on the machine
# and its load; load generator and server share its cores.
set -euo pipefail
cd "$(dirname "$0")/../.."

out=${1:?usage: serving_study.sh OUTDIR [--tiny] [--hidden SIZES] [--slo_ms N] [--rounds N]}
shift
tiny=0
hidden=256,128
slo_ms=""
rounds=1
while [ $# -gt 0 ]; do
  case "$1" in
    --tiny) tiny=1; shift ;;
    --hidden)
      [[ "${2:-}" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] ||
        { echo "serving_study.sh: --hidden takes sizes like 256,128" >&2; exit 2; }
      hidden=$2; shift 2 ;;
    --rounds)
      [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] ||
        { echo "serving_study.sh: --rounds takes a count >= 1" >&2; exit 2; }
      rounds=$2; shift 2 ;;
    --slo_ms)
      [[ "${2:-}" =~ ^[0-9]+(\.[0-9]+)?$ ]] && awk -v v="$2" 'BEGIN { exit !(v > 0) }' ||
        { echo "serving_study.sh: --slo_ms takes milliseconds > 0" >&2; exit 2; }
      slo_ms=$2; shift 2 ;;
    *) echo "serving_study.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd)

find_bin() {  # dir, package, name
  if [ -x "$1/$3" ]; then echo "$1/$3"; else echo "$1/$2/$3"; fi
}
if [ -n "${ASYNCPS_BIN:-}" ]; then
  bin=$ASYNCPS_BIN
else
  deploy/install_deps.sh
  if ! bazel build -c opt //server:ps_server //worker:ps_worker \
      //serving:ps_serve //tests/bench:serve_load >"$out/build.log" 2>&1; then
    grep -E 'ERROR|error:' "$out/build.log" | head -n 20
    exit 1
  fi
  bin=$(bazel info -c opt bazel-bin 2>/dev/null)
fi
server_bin=$(find_bin "$bin" server ps_server)
worker_bin=$(find_bin "$bin" worker ps_worker)
serve_bin=$(find_bin "$bin" serving ps_serve)
load_bin=$(find_bin "$bin" tests/bench serve_load)
for b in "$server_bin" "$worker_bin" "$serve_bin" "$load_bin"; do
  [ -x "$b" ] || { echo "serving_study.sh: $b not found" >&2; exit 1; }
done
export OPENBLAS_NUM_THREADS=1

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# Waits (10 s at most) for process $1 to write a port to file $2.
await_port() {
  for _ in $(seq 100); do
    [ -s "$2" ] && return 0
    kill -0 "$1" 2>/dev/null || break
    sleep 0.1
  done
  echo "serving_study.sh: no port in $2" >&2
  return 1
}

# The model: one shard, one worker, one epoch (--tiny: a few steps).
ckpt="$out/checkpoint"
rm -rf "$ckpt" "$out/shard.port"
"$server_bin" --port=0 --port_file="$out/shard.port" --checkpoint_dir="$ckpt" \
  >"$out/shard.log" 2>&1 &
shard=$!
pids+=("$shard")
await_port "$shard" "$out/shard.port"
train_flags=(--epochs=1 --hidden="$hidden")
[ "$tiny" = 1 ] && train_flags+=(--steps=20)
if ! "$worker_bin" --servers="127.0.0.1:$(cat "$out/shard.port")" \
    "${train_flags[@]}" >"$out/worker.log" 2>&1; then
  echo "serving_study.sh: training failed; see $out/worker.log" >&2
  exit 1
fi
kill -TERM "$shard"
wait "$shard" || { echo "serving_study.sh: the shard failed to stop" >&2; exit 1; }
pids=()
echo "model: MLP 784-${hidden//,/-}-10, $(grep -m1 'final test accuracy' "$out/worker.log")"

policies=(none t50 t200 t1000 t5000 auto)
[ -n "$slo_ms" ] && policies+=(auto_slo)
policy_flags() {
  case "$1" in
    none) echo "--max_batch_size=1 --batch_timeout_us=0" ;;
    auto) echo "--max_batch_size=64 --batch_timeout_us=auto" ;;
    auto_slo) echo "--max_batch_size=64 --batch_timeout_us=auto --latency_slo_ms=$slo_ms" ;;
    t*) echo "--max_batch_size=64 --batch_timeout_us=${1#t}" ;;
  esac
}

serve_pid=""
start_serve() {  # policy [max_queue]
  rm -f "$out/serve.port"
  # shellcheck disable=SC2046
  "$serve_bin" --checkpoint_dir="$ckpt" --host=127.0.0.1 --port=0 \
    --port_file="$out/serve.port" --max_queue="${2:-4096}" $(policy_flags "$1") \
    >>"$out/serve_$1.log" 2>&1 &
  serve_pid=$!
  pids+=("$serve_pid")
  await_port "$serve_pid" "$out/serve.port"
}
stop_serve() {
  if ! kill -TERM "$serve_pid" 2>/dev/null; then
    wait "$serve_pid" && rc=0 || rc=$?
    echo "serving_study.sh: ps_serve ($1) exited early with status $rc; its log:" >&2
    tail -n 20 "$out/serve_$1.log" >&2
    exit 1
  fi
  wait "$serve_pid" || { echo "serving_study.sh: ps_serve failed to stop" >&2; exit 1; }
  pids=()
}

# load RATE REQUESTS: one CSV row of serve_load.
load() {
  if ! "$load_bin" --target="127.0.0.1:$(cat "$out/serve.port")" --rate="$1" \
      --requests="$2" --connections=16 --deadline_ms=5000 --seed=7 \
      2>>"$out/load.log"; then
    echo "serving_study.sh: serve_load failed; its log:" >&2
    tail -n 20 "$out/load.log" >&2
    return 1
  fi
}

if [ "$tiny" = 1 ]; then sat_requests=300; seconds=0.25; min_requests=40
else sat_requests=12000; seconds=2; min_requests=300; fi

echo "policy,saturation_rps,mean_batch_rows" >"$out/summary.csv"
best_sat=0
for p in "${policies[@]}"; do
  # Saturation: a burst the queue holds whole, so the figure is the rate at
  # which the server drains it (a request whose deadline passes while it
  # waits is answered DEADLINE_EXCEEDED without being computed), not that
  # rate less the cost of refusing what overflows.
  start_serve "$p" $((sat_requests + 1))
  row=$(load 200000 "$sat_requests") || exit 1
  stop_serve "$p"
  sat=$(echo "$row" | cut -d, -f2)
  batch=$(echo "$row" | cut -d, -f10)
  echo "$p,$sat,$batch" >>"$out/summary.csv"
  best_sat=$(awk -v a="$best_sat" -v b="$sat" 'BEGIN { print (b > a ? b : a) }')
done

fractions=(0.1 0.2 0.4 0.6 0.8 0.9 1.0 1.2)
columns="policy,fraction,target_rps,achieved_rps,sent,ok,refused,failed,mean_ms,p50_ms,p99_ms,mean_batch_rows"
echo "round,$columns" >"$out/rounds.csv"
for ((round = 1; round <= rounds; round++)); do
  for p in "${policies[@]}"; do
    start_serve "$p"
    for f in "${fractions[@]}"; do
      rate=$(awk -v s="$best_sat" -v f="$f" 'BEGIN { printf "%.1f", s * f }')
      n=$(awk -v r="$rate" -v t="$seconds" -v m="$min_requests" \
        'BEGIN { n = int(r * t); print (n < m ? m : n) }')
      load "$rate" $((n / 4)) >/dev/null || exit 1  # warm-up at this rate
      row=$(load "$rate" "$n") || exit 1
      echo "$round,$p,$f,$row" >>"$out/rounds.csv"
    done
    stop_serve "$p"
  done
done
# Per policy and rate, the round whose mean latency is the median (the
# lower middle one for an even count), with everything it measured.
{
  echo "$columns"
  for p in "${policies[@]}"; do
    for f in "${fractions[@]}"; do
      awk -F, -v p="$p" -v f="$f" '$2 == p && $3 == f' "$out/rounds.csv" |
        sort -t, -k10,10g | awk -v n="$rounds" 'NR == int((n + 1) / 2)' | cut -d, -f2-
    done
  done
} >"$out/study.csv"

# auto against the best fixed wait at every rate, which fixed waits come
# within 10% of the best anywhere, and how far one policy's own rounds lie
# apart there (max / min of its rounds' mean latencies, the median over the
# policies): the noise a 10% comparison is up against.
awk -F, '
  FNR == NR {
    if (FNR > 1 && $10 > 0) {
      k = $2 SUBSEP $3
      if (!(k in lo) || $10 < lo[k]) lo[k] = $10
      if (!(k in hi) || $10 > hi[k]) hi[k] = $10
    }
    next
  }
  FNR > 1 { mean[$1, $2] = $9; ok[$1, $2] = $6; sent[$1, $2] = $5; f[$2] = 1 }
  END {
    # Kept as numbers: through a string (CONVFMT, 6 digits) and then
    # %.3f, a ratio was rounded twice (1.0875 -> 1.087 where %.3f of the
    # ratio itself gives 1.088).
    for (k in lo) {
      split(k, pf, SUBSEP)
      ns[pf[2]]++
      sv[pf[2], ns[pf[2]]] = hi[k] / lo[k]
    }
    print "fraction,best_fixed,best_fixed_mean_ms,auto_mean_ms,auto_over_best,fixed_within_10pct,round_spread"
    n = split("t50 t200 t1000 t5000", fixed, " ")
    for (fr in f) {
      best = ""; bm = 0
      for (i = 1; i <= n; i++) {
        p = fixed[i]
        if (ok[p, fr] < sent[p, fr]) continue  # refused some: not a contender
        if (best == "" || mean[p, fr] < bm) { best = p; bm = mean[p, fr] }
      }
      within = ""
      for (i = 1; i <= n; i++) {
        p = fixed[i]
        if (best != "" && ok[p, fr] == sent[p, fr] && mean[p, fr] <= 1.1 * bm) within = within " " p
      }
      ratio = (best == "" || bm == 0) ? "" : sprintf("%.3f", mean["auto", fr] / bm)
      m = ns[fr] + 0
      for (i = 1; i <= m; i++) v[i] = sv[fr, i]
      for (i = 2; i <= m; i++) {  # insertion sort of a handful
        x = v[i]; j = i - 1
        while (j >= 1 && v[j] + 0 > x + 0) { v[j + 1] = v[j]; j-- }
        v[j + 1] = x
      }
      spread = m > 0 ? sprintf("%.3f", v[int((m + 1) / 2)]) : ""
      printf "%s,%s,%s,%s,%s,%s,%s\n", fr, best, bm, mean["auto", fr], ratio, substr(within, 2), spread
    }
  }' "$out/rounds.csv" "$out/study.csv" | { read -r header; echo "$header"; sort -t, -k1,1g; } \
  >"$out/auto_vs_fixed.csv"

if command -v gnuplot >/dev/null; then
  {
    echo 'set datafile separator ","'
    echo 'set terminal pngcairo size 1200,520 font "sans,10" noenhanced'
    echo "set output \"$out/latency.png\""
    echo 'set multiplot layout 1,2'
    echo 'set logscale y'
    echo 'set xlabel "offered rate (requests/s)"'
    echo 'set key left top'
    for stat in mean p99; do
      col=9; [ "$stat" = p99 ] && col=11
      echo "set ylabel \"$stat latency (ms)\""
      echo "set title \"$stat latency against offered rate\""
      plot="plot"
      for p in "${policies[@]}"; do
        plot+=" \"< grep '^$p,' $out/study.csv\" using 3:$col with linespoints title \"$p\","
      done
      echo "${plot%,}"
    done
    echo 'unset multiplot'
  } >"$out/latency.gp"
  gnuplot "$out/latency.gp"
else
  echo "gnuplot not installed: no latency.png (apt-get install gnuplot-nox)"
fi

none_sat=$(awk -F, '$1 == "none" { print $2 }' "$out/summary.csv")
echo "saturation throughput (requests/s, mean batch rows):"
awk -F, -v none="$none_sat" 'NR > 1 {
  printf "  %-8s %9.0f  %6.2f rows  %5.2fx no batching\n", $1, $2, $3, (none > 0 ? $2 / none : 0) }' \
  "$out/summary.csv"
echo "auto against the best fixed wait (mean latency; fixed waits within 10% of the best; rounds of one policy apart):"
awk -F, 'NR > 1 { printf "  %4.0f%% of saturation: best %-5s %8s ms, auto %8s ms (%sx); within 10%%: %s; rounds apart %sx\n",
  $1 * 100, $2, $3, $4, $5, ($6 == "" ? "-" : $6), $7 }' "$out/auto_vs_fixed.csv"
# A fixed wait within 10% of the best at every rate would make auto moot.
everywhere=$(awk -F, 'NR > 1 { n++; split($6, w, " "); for (i in w) c[w[i]]++ }
  END { for (p in c) if (c[p] == n) printf "%s ", p }' "$out/auto_vs_fixed.csv")
echo "fixed waits within 10% of the best at every rate: ${everywhere:-none}"
echo "auto within 10% of the best fixed wait at every rate: $(awk -F, '
  NR > 1 && $5 != "" { n++; if ($5 <= 1.1) k++ } END { printf "%d of %d", k, n }' \
  "$out/auto_vs_fixed.csv")"
if [ -n "$slo_ms" ]; then
  awk -F, -v slo="$slo_ms" 'BEGIN { print "fraction,p99_ms,slo_ms,within" }
    $1 == "auto_slo" && $2 <= 0.8 {
      printf "%s,%s,%s,%s\n", $2, $11, slo, ($11 <= slo && $6 == $5 ? "yes" : "no") }' \
    "$out/study.csv" >"$out/slo.csv"
  echo "auto with --latency_slo_ms=$slo_ms, p99 up to 80% of saturation:"
  awk -F, 'NR > 1 { printf "  %4.0f%% of saturation: p99 %8s ms (%s)\n", $1 * 100, $2,
    ($4 == "yes" ? "within" : "OVER") }' "$out/slo.csv"
fi
echo "wrote $out/study.csv, $out/summary.csv, $out/auto_vs_fixed.csv$([ -n "$slo_ms" ] && echo ", $out/slo.csv")$([ -f "$out/latency.png" ] && echo ", $out/latency.png")"
