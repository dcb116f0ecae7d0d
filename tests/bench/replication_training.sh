#!/usr/bin/env bash
# Training throughput of replicated shards against unreplicated ones:
# deploy/local.sh (2 shards, 4 workers, the MLP on Fashion-MNIST) with
# --replicas 1 and --replicas 2, alternating, ROUNDS times; prints each
# run's examples/s and accuracy, then the median ratio R2 / R1.
#
#   tests/bench/replication_training.sh [ROUNDS] [EPOCHS]   # default 3 2
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-3}
epochs=${2:-2}
bazel build //server:ps_server //worker:ps_worker >/dev/null 2>&1
declare -a r1 r2
for ((i = 0; i < rounds; i++)); do
  for r in 1 2; do
    out=$(deploy/local.sh --no-build --replicas "$r" --epochs "$epochs" 2>&1 | tail -n 3)
    rate=$(echo "$out" | sed -nE 's/.* ([0-9]+) examples\/s in total.*/\1/p')
    acc=$(echo "$out" | sed -nE 's/^final test accuracy: ([0-9.]+)$/\1/p' | tail -n 1)
    echo "round=$i replicas=$r examples_per_s=$rate accuracy=$acc"
    if [ "$r" = 1 ]; then r1+=("$rate"); else r2+=("$rate"); fi
  done
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
m1=$(median "${r1[@]}")
m2=$(median "${r2[@]}")
awk -v a="$m1" -v b="$m2" 'BEGIN { printf "median examples/s: R=1 %d, R=2 %d, ratio %.2f\n", a, b, b / a }'
