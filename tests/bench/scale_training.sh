#!/usr/bin/env bash
# Training through shard-count changes: deploy/local.sh (4 shard processes,
# the slots on 2 of them: --num_slots=64 --serving_shards=2; 4 workers, the
# MLP on Fashion-MNIST) undisturbed, then again with psctl scale taking the
# run 2 -> 3 -> 4 -> 2 shards at a quarter, half and three quarters of the
# undisturbed run's time; ROUNDS times, alternating. Prints each run's exit
# status, examples/s and final accuracy, each scale's moves, and the median
# accuracy and examples/s of each kind. With REPLICAS = 2 each shard is a
# group of two processes (etcd started by local.sh) and psctl finds the
# groups' primaries in etcd.
#
#   tests/bench/scale_training.sh [ROUNDS] [EPOCHS] [WORKERS] [REPLICAS]
#   # default 3 5 4 1
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-3}
epochs=${2:-5}
workers=${3:-4}
replicas=${4:-1}
bazel build //server:ps_server //worker:ps_worker //tools:psctl >/dev/null 2>&1
psctl=$(bazel info bazel-bin 2>/dev/null)/tools/psctl
flags=(--no-build --shards 4 --replicas "$replicas" --workers "$workers"
       --epochs "$epochs" --server-flags "--num_slots=64 --serving_shards=2")
result() {  # LOG -> "examples/s accuracy"
  local rate acc
  rate=$(sed -nE 's/.* ([0-9]+) examples\/s in total.*/\1/p' "$1" | tail -n 1)
  acc=$(sed -nE 's/^final test accuracy: ([0-9.]+)$/\1/p' "$1" | tail -n 1)
  echo "${rate:-?} ${acc:-?}"
}
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT

ms() { echo $(($(date +%s%N) / 1000000)); }
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
declare -a base_accs scaled_accs base_rates scaled_rates
for ((round = 0; round < rounds; round++)); do
  start=$(ms)
  set +e
  deploy/local.sh "${flags[@]}" >"$log/base" 2>&1
  base_code=$?
  set -e
  base_ms=$(($(ms) - start))
  read -r base_rate base_acc <<<"$(result "$log/base")"
  echo "round $round undisturbed: exit $base_code, $((base_ms / 1000))s, $base_rate examples/s, accuracy $base_acc"
  base_accs+=("$base_acc")
  base_rates+=("$base_rate")

  deploy/local.sh "${flags[@]}" >"$log/scaled" 2>&1 &
  run=$!
  find=""
  for _ in $(seq 600); do
    servers=$(sed -nE 's/^cluster: [0-9]+ shard\(s\) at ([^;]+);.*/\1/p' "$log/scaled")
    [ -n "$servers" ] && find="--servers=$servers"
    etcd=$(sed -nE 's/^cluster: .*shard map in etcd at ([^,]+), run ([^)]+)\).*/--etcd_endpoints=\1 --run_id=\2/p' "$log/scaled")
    [ -n "$etcd" ] && find="$etcd"
    [ -n "$find" ] && break
    sleep 0.1
  done
  [ -n "$find" ] || { echo "no cluster line"; kill "$run"; exit 1; }
  t0=$(ms)
  step=$((base_ms / 4))
  i=1
  for m in 3 4 2; do
    wait_ms=$((t0 + i * step - $(ms)))
    if [ "$wait_ms" -gt 0 ]; then sleep "$((wait_ms / 1000)).$(printf %03d $((wait_ms % 1000)))"; fi
    kill -0 "$run" 2>/dev/null || { echo "the run ended before scale to $m"; break; }
    echo "  scale to $m at $((($(ms) - t0) / 1000))s:"
    # shellcheck disable=SC2086  # $find holds one or two flags
    "$psctl" scale $find --shards="$m" | sed 's/^/    /'
    i=$((i + 1))
  done
  set +e
  wait "$run"
  scaled_code=$?
  set -e
  read -r rate acc <<<"$(result "$log/scaled")"
  echo "round $round scaled 2->3->4->2: exit $scaled_code, $rate examples/s, accuracy $acc"
  grep -hiE " E |error" "$log/scaled" | head -n 5 || true
  scaled_accs+=("$acc")
  scaled_rates+=("$rate")
done
awk -v a="$(median "${base_accs[@]}")" -v b="$(median "${scaled_accs[@]}")" \
    -v r="$(median "${base_rates[@]}")" -v s="$(median "${scaled_rates[@]}")" 'BEGIN {
  printf "median accuracy: undisturbed %.4f, scaled %.4f (%+.4f); median examples/s: %d, %d (%.2fx)\n",
         a, b, b - a, r, s, s / r }'
