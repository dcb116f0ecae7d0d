#!/usr/bin/env bash
# PyTorch training throughput of the Fashion-MNIST CNN example
# (python/examples/fashion_mnist_cnn.py): a plain single-process PyTorch
# loop (torch.optim; 1 and 2 torch threads) against asynchronous training
# through asyncps with 1 and 2 worker processes (2 shards, 1 torch thread
# per worker). Each setup trains one epoch over the first --examples
# training images; the four setups run one after the other, --rounds times
# (the machine's load drifts, so every round has all four), and the median
# examples/s of each is printed with its ratio to the 1-thread loop. Logs
# go to OUTDIR.
#
# Build first: bazel build //server:ps_server //python:asyncps
# Usage: python/bench/torch_throughput.sh OUTDIR [--rounds N] [--examples N]
set -euo pipefail
if [[ $# -lt 1 || "$1" == -* ]]; then
  echo "usage: $0 OUTDIR [--rounds N] [--examples N]" >&2
  exit 2
fi
out=$(mkdir -p "$1" && cd "$1" && pwd)
shift
rounds=3
examples=20000
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --examples) examples="$2"; shift 2 ;;
    *) echo "torch_throughput.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/../.."
launch=deploy/local_pytorch.sh
data="--train_examples=$examples --test_examples=1000 --log_every=0"

rate() {  # the examples/s figure of a run's log
  grep -hE '(local done|examples/s in total)' "$1" |
    sed -E 's/.*[( ]([0-9.]+) examples\/s.*/\1/' | tail -n 1
}

run() {  # NAME ROUND ARGS...
  local name=$1 round=$2
  shift 2
  "$launch" --no-build --epochs 1 "$@" >"$out/$name.$round.log" 2>&1 ||
    { echo "torch_throughput.sh: $name failed; see $out/$name.$round.log" >&2; exit 1; }
  echo "$name $(rate "$out/$name.$round.log")"
}

for ((r = 0; r < rounds; r++)); do
  OMP_NUM_THREADS=1 run local_1thread "$r" --local --worker-flags "$data --threads=1"
  OMP_NUM_THREADS=2 run local_2threads "$r" --local --worker-flags "$data --threads=2"
  run asyncps_1worker "$r" --shards 2 --workers 1 --worker-flags "$data" \
    --logdir "$out/asyncps_1worker.$r"
  run asyncps_2workers "$r" --shards 2 --workers 2 --worker-flags "$data" \
    --logdir "$out/asyncps_2workers.$r"
done | tee "$out/runs.txt"
/usr/bin/python3 - "$out/runs.txt" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    name, rate = line.split()
    runs.setdefault(name, []).append(float(rate))
base = statistics.median(runs["local_1thread"])
for name, rates in runs.items():
    med = statistics.median(rates)
    print(f"{name:18s} examples/s {med:8.0f} (median of {len(rates)})  "
          f"ratio to local_1thread {med / base:.2f}")
PY
