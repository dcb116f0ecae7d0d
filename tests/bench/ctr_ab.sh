#!/usr/bin/env bash
# CTR training throughput of two ps_worker builds, side by side: for each
# round and each build (alternating, so drift in the machine's load hits
# both alike), 2 fresh shards (the same ps_server) and 2 CTR workers train
# a fixed number of examples; the line per run gives the workers' wall time
# and examples/s, the summary the median of each and B / A.
#
#   tests/bench/ctr_ab.sh --a DIR_A --b DIR_B [--server DIR] [--rounds N]
#                         [--examples N] [--out DIR]
#
# DIR_A and DIR_B hold a ps_worker each (flat or Bazel's bazel-bin layout);
# the shards come from --server (default DIR_B). A benchmark, not a test:
# the numbers depend on the machine and its load.
set -euo pipefail
cd "$(dirname "$0")/../.."

a="" b="" server="" rounds=3 examples=400000 out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --a) a="$2"; shift 2 ;;
    --b) b="$2"; shift 2 ;;
    --server) server="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --examples) examples="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "ctr_ab.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
[ -n "$a" ] && [ -n "$b" ] || { echo "ctr_ab.sh: --a and --b are required" >&2; exit 2; }
server=${server:-$b}
bin() {  # the binary $2 in directory $1, flat or bazel-bin layout
  for p in "$1/$2" "$1/worker/$2" "$1/server/$2"; do
    [ -x "$p" ] && { echo "$p"; return; }
  done
  echo "ctr_ab.sh: no $2 in $1" >&2; exit 2
}
worker_a=$(bin "$a" ps_worker) worker_b=$(bin "$b" ps_worker)
ps_server=$(bin "$server" ps_server)
out=${out:-$(mktemp -d)}
mkdir -p "$out"
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# One run: prints "<wall_s> <examples/s>".
run() {
  local worker=$1 dir=$2
  mkdir -p "$dir"
  # run() is called in a command substitution (a subshell): its own trap
  # kills what it started on every way out.
  trap cleanup EXIT
  pids=()
  for i in 0 1; do
    rm -f "$dir/shard$i.port"
    "$ps_server" --shard_index=$i --num_shards=2 --port=0 \
      --port_file="$dir/shard$i.port" >"$dir/shard$i.log" 2>&1 &
    pids+=($!)
  done
  local servers=""
  for i in 0 1; do
    for _ in $(seq 100); do [ -s "$dir/shard$i.port" ] && break; sleep 0.1; done
    [ -s "$dir/shard$i.port" ] || { echo "shard $i did not start" >&2; exit 1; }
    servers+="${servers:+,}127.0.0.1:$(cat "$dir/shard$i.port")"
  done
  local t0 t1 w
  t0=$(date +%s.%N)
  local wpids=()
  for w in 0 1; do
    OPENBLAS_NUM_THREADS=1 timeout 600 "$worker" --model=ctr --servers="$servers" \
      --worker_id=$w --num_workers=2 --ctr_train_examples="$examples" \
      --ctr_test_examples=20000 --log_every_steps=1000000 \
      >"$dir/worker$w.log" 2>&1 &
    wpids+=($!)
  done
  for p in "${wpids[@]}"; do wait "$p" || { echo "a worker failed: $dir" >&2; exit 1; }; done
  t1=$(date +%s.%N)
  cleanup
  pids=()
  awk -v a="$t0" -v b="$t1" -v n="$examples" 'BEGIN { printf "%.2f %.0f\n", b - a, n / (b - a) }'
}

printf 'round build wall_s examples_per_s\n' | tee "$out/runs.txt"
for r in $(seq "$rounds"); do
  for v in a b; do
    worker=$worker_a; [ "$v" = b ] && worker=$worker_b
    line=$(run "$worker" "$out/r$r$v")
    printf '%s %s %s\n' "$r" "$v" "$line" | tee -a "$out/runs.txt"
  done
done
awk 'NR > 1 { e[$2] = e[$2] " " $4 }
  function median(s,   n, x, i, j, t) {
    n = split(s, x, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++)
      if (x[j] + 0 < x[i] + 0) { t = x[i]; x[i] = x[j]; x[j] = t }
    return n % 2 ? x[(n + 1) / 2] : (x[n / 2] + x[n / 2 + 1]) / 2
  }
  END {
    ma = median(e["a"]); mb = median(e["b"])
    printf "median examples/s: a %.0f, b %.0f; b / a = %.3f\n", ma, mb, mb / ma
  }' "$out/runs.txt"
echo "logs: $out"
