#!/usr/bin/env bash
# PyTorch training throughput of the Fashion-MNIST CNN example
# (python/examples/fashion_mnist_cnn.py): a plain single-process PyTorch
# loop (torch.optim, 1 and 2 torch threads) against asynchronous training
# through asyncps with 1 and 2 worker processes (2 shards, 1 torch thread
# per worker), each for one epoch over the 60k training images, measured
# one after the other in the same run. Prints examples/s per setup and the
# ratio to the 1-thread baseline; logs go to OUTDIR.
#
# Build first: bazel build //server:ps_server //python:asyncps
# Usage: python/bench/torch_throughput.sh OUTDIR [--epochs N]
set -euo pipefail
if [[ $# -lt 1 || "$1" == -* ]]; then
  echo "usage: $0 OUTDIR [--epochs N]" >&2
  exit 2
fi
out=$(mkdir -p "$1" && cd "$1" && pwd)
shift
epochs=1
while [ $# -gt 0 ]; do
  case "$1" in
    --epochs) epochs="$2"; shift 2 ;;
    *) echo "torch_throughput.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/../.."
launch=deploy/local_pytorch.sh

rate() {  # the examples/s figure of a run's log
  grep -hE '(local done|examples/s in total)' "$1" |
    sed -E 's/.*[( ]([0-9.]+) examples\/s.*/\1/' | tail -n 1
}

run() {  # NAME ARGS...
  local name=$1
  shift
  OMP_NUM_THREADS=${threads:-1} "$launch" --no-build --epochs "$epochs" "$@" \
    >"$out/$name.log" 2>&1
  echo "$name $(rate "$out/$name.log") $(grep -h '^final test accuracy' "$out/$name.log" | tail -n 1 | awk '{print $4}')"
}

{
  threads=1 run local_1thread --local --worker-flags "--threads=1"
  threads=2 run local_2threads --local --worker-flags "--threads=2"
  run asyncps_1worker --shards 2 --workers 1 --logdir "$out/asyncps_1worker"
  run asyncps_2workers --shards 2 --workers 2 --logdir "$out/asyncps_2workers"
} | tee "$out/summary.txt" | awk '
  NR == 1 { base = $2 }
  { printf "%-18s examples/s %8.0f  ratio %.2f  test accuracy %s\n", $1, $2,
           $2 / base, $3 }'
