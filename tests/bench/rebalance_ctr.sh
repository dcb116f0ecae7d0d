#!/usr/bin/env bash
# Rebalancing a skewed run: 4 shards of a slotted map (--num_slots 4096)
# train the CTR model (Zipf(1.2) ids per field) with 2 workers; psctl
# rebalance plans a map from the shards' per-slot push bytes; the shards
# stop (final checkpoints), psctl reshard --map moves their files onto it,
# and the restarted shards train the same amount again. Prints each
# shard's push bytes and the busiest shard over the mean, measured, in
# both phases (phase 2's is what the new map gives), and examples/s. With
# --cost R it measures instead what a slotted map costs when nothing moves:
# R rounds of fresh runs alternating the static map and 4096 slots, their
# examples/s and the median ratio. A benchmark, not a test.
#
#   tests/bench/rebalance_ctr.sh [--examples N] [--out DIR] [--cost ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
examples=400000 out="" cost=0
while [ $# -gt 0 ]; do
  case "$1" in
    --examples) examples="$2"; shift 2 ;;
    --cost) cost="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "rebalance_ctr.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
bazel build //server:ps_server //worker:ps_worker //tools:psctl >/dev/null 2>&1
ps_server=bazel-bin/server/ps_server ps_worker=bazel-bin/worker/ps_worker
psctl=bazel-bin/tools/psctl
out=${out:-$(mktemp -d)}
mkdir -p "$out"
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
servers=""

start_shards() {  # dir run flags...
  local dir="$1" run="$2"; shift 2
  pids=() servers=""
  for i in 0 1 2 3; do
    rm -f "$out/shard$i.port"
    "$ps_server" --shard_index=$i --num_shards=4 --port=0 \
      --port_file="$out/shard$i.port" --checkpoint_dir="$dir" --run_id="$run" \
      "$@" >>"$out/shard$i.log" 2>&1 &
    pids+=($!)
  done
  for i in 0 1 2 3; do
    for _ in $(seq 300); do [ -s "$out/shard$i.port" ] && break; sleep 0.1; done
    [ -s "$out/shard$i.port" ] || { echo "shard $i did not start: $out" >&2; exit 1; }
    servers+="${servers:+,}127.0.0.1:$(cat "$out/shard$i.port")"
  done
}

train() {  # run: 2 workers, wall time and examples/s on stdout
  local t0 t1 w
  t0=$(date +%s.%N)
  local wp=()
  for w in 0 1; do
    OPENBLAS_NUM_THREADS=1 timeout 900 "$ps_worker" --model=ctr --servers="$servers" \
      --run_id="$1" --worker_id=$w --num_workers=2 --ctr_train_examples="$examples" \
      --ctr_test_examples=20000 --log_every_steps=1000000 \
      >"$out/worker$w-$1.log" 2>&1 &
    wp+=($!)
  done
  for w in "${wp[@]}"; do wait "$w" || { echo "a worker failed: $out" >&2; exit 1; }; done
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" -v n="$examples" 'BEGIN { printf "%.1f s, %.0f examples/s", b - a, n / (b - a) }'
}

measure() {  # phase name, plan file: the measured per-shard push bytes
  "$psctl" rebalance --servers="$servers" --out="$2" --by=bytes -o json >"$out/$1.json"
  python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
b = d["before"]; mean = sum(b) / len(b)
print("push bytes per shard " + " ".join("%.1fM" % (x / 1e6) for x in b) +
      ", busiest / mean %.3f (planned next: %.3f, %d slots)" %
      (max(b) / mean, d["imbalance_after"], d["moved_slots"]))' "$out/$1.json"
}

stop_shards() {
  for p in "${pids[@]}"; do kill -TERM "$p"; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}

if [ "$cost" -gt 0 ]; then
  declare -a static slotted
  for ((r = 0; r < cost; r++)); do
    for slots in 0 4096; do
      start_shards "$out/cost-$r-$slots" "cost-$r-$slots" --num_slots=$slots
      line=$(train "cost-$r-$slots")
      stop_shards
      echo "round $r, --num_slots=$slots: $line"
      rate=$(echo "$line" | sed -nE 's/.* ([0-9]+) examples\/s/\1/p')
      if [ "$slots" = 0 ]; then static+=("$rate"); else slotted+=("$rate"); fi
    done
  done
  median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
  awk -v a="$(median "${static[@]}")" -v b="$(median "${slotted[@]}")" \
    'BEGIN { printf "median examples/s: static %d, 4096 slots %d, ratio %.3f\n", a, b, b / a }'
  exit 0
fi

start_shards "$out/ckpt1" phase1 --num_slots=4096
echo "phase 1 (even map): $(train phase1); $(measure phase1 "$out/map.txt")"
stop_shards
"$psctl" reshard --from="$out/ckpt1" --to="$out/ckpt2" --shards=4 --map="$out/map.txt" >"$out/reshard.txt"
start_shards "$out/ckpt2" phase2 --adopt_run=phase1
echo "phase 2 (rebalanced map): $(train phase2); $(measure phase2 "$out/map2.txt")"
echo "logs: $out"
