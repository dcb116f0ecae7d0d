#!/usr/bin/env bash
# Capped against uncapped shards on the drifting CTR stream: 2 fresh shards
# and one CTR worker train the same data (--ctr_drift_share) twice, once
# with no memory cap and once with --max_parameter_bytes=CAP and the given
# table eviction (and admission) flags; a line per run gives the worker's
# wall time, examples/s, final test AUC, rows created (worker's count) and
# each shard's peak RSS. A benchmark, not a test.
#
#   tests/bench/capped_ctr.sh --cap 64M [--examples N] [--eviction lru]
#                             [--admit N] [--out DIR] [-- extra worker flags]
set -euo pipefail
cd "$(dirname "$0")/../.."
cap="" examples=400000 eviction=lru admit=0 out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cap) cap="$2"; shift 2 ;;
    --examples) examples="$2"; shift 2 ;;
    --eviction) eviction="$2"; shift 2 ;;
    --admit) admit="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "capped_ctr.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
[ -n "$cap" ] || { echo "capped_ctr.sh: --cap is required" >&2; exit 2; }
ps_server=bazel-bin/server/ps_server ps_worker=bazel-bin/worker/ps_worker
out=${out:-$(mktemp -d)}
mkdir -p "$out"
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
drift=(--ctr_drift_share=0.3 --ctr_drift_window=20000
       --ctr_drift_ids_per_example=1 "$@")

run() {  # name, server flags..., then -- worker flags...
  local dir="$out/$1"; shift
  local sflags=() wflags=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do sflags+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  wflags=("$@")
  mkdir -p "$dir"
  # run() is called in a pipeline (a subshell): its own trap kills what it
  # started on every way out.
  trap cleanup EXIT
  pids=()
  for i in 0 1; do
    "$ps_server" --shard_index=$i --num_shards=2 --port=0 \
      --port_file="$dir/shard$i.port" "${sflags[@]}" >"$dir/shard$i.log" 2>&1 &
    pids+=($!)
  done
  local servers=""
  for i in 0 1; do
    for _ in $(seq 100); do [ -s "$dir/shard$i.port" ] && break; sleep 0.1; done
    [ -s "$dir/shard$i.port" ] || { echo "shard $i did not start: $dir" >&2; exit 1; }
    servers+="${servers:+,}127.0.0.1:$(cat "$dir/shard$i.port")"
  done
  local t0 t1
  t0=$(date +%s.%N)
  OPENBLAS_NUM_THREADS=1 timeout 900 "$ps_worker" --model=ctr \
    --servers="$servers" --ctr_train_examples="$examples" \
    --ctr_test_examples=20000 --log_every_steps=1000000 "${drift[@]}" \
    "${wflags[@]}" >"$dir/worker.log" 2>&1 || { echo "worker failed: $dir" >&2; exit 1; }
  t1=$(date +%s.%N)
  local rss=""
  for p in "${pids[@]}"; do
    rss+=" $(awk '/VmHWM/ { printf "%.0fM", $2 / 1024 }' /proc/$p/status)"
  done
  cleanup
  local auc created
  auc=$(grep -o 'final test auc: [0-9.]*' "$dir/worker.log" | awk '{print $4}')
  created=$(grep -o 'rows created[^,;)]*' "$dir/worker.log" | tail -1)
  awk -v a="$t0" -v b="$t1" -v n="$examples" -v name="$(basename "$dir")" \
    -v auc="$auc" -v c="$created" -v r="$rss" \
    'BEGIN { printf "%s wall %.1fs, %.0f examples/s, auc %s, %s, shard peak RSS%s\n", name, b - a, n / (b - a), auc, c, r }'
}

admit_flags=()
[ "$admit" != 0 ] && admit_flags=(--table_admit_count="$admit")
run uncapped -- | tee "$out/summary.txt"
run capped --max_parameter_bytes="$cap" -- --table_eviction="$eviction" \
  "${admit_flags[@]}" | tee -a "$out/summary.txt"
echo "logs: $out"
