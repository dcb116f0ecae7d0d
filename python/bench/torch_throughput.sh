#!/usr/bin/env bash
# PyTorch training throughput of the Fashion-MNIST example
# (python/examples/fashion_mnist_cnn.py, --model cnn or mlp): a plain
# single-process PyTorch loop (torch.optim; 1 and 2 torch threads) against
# asynchronous training through asyncps with each count of --shards shards
# (default 2) and of --workers worker processes (1 torch thread per
# worker). Each setup trains --epochs (default 1) over the first --examples
# training images; the setups run one after the other, --rounds times (the machine's
# load drifts, so every round has all of them), and the median examples/s
# of each is printed with its ratio to the 1-thread loop, and the final test
# accuracy. --overlap adds, for each shard and worker count, a run whose
# workers overlap their pushes with computation (Worker overlap_push) and
# one that overlaps pulls too (overlap_pull). --baseline DIR runs every
# asyncps setup a second time, in the same round, with the build in DIR (a
# bazel-bin folder, or a copy holding server/ps_server and python/site,
# e.g. of an older commit), named base_SETUP: a before/after comparison
# under the same load. --bin DIR measures the build in DIR instead of
# the default configuration's bazel-bin (e.g. a -c opt build). Logs go to
# OUTDIR.
#
# Build first: bazel build //server:ps_server //python:asyncps
# Usage: python/bench/torch_throughput.sh OUTDIR [--rounds N] [--examples N]
#            [--model cnn|mlp] [--shards "1 2"] [--workers "1 2 4"]
#            [--overlap] [--baseline DIR] [--bin DIR] [--epochs N]
set -euo pipefail
if [[ $# -lt 1 || "$1" == -* ]]; then
  echo "usage: $0 OUTDIR [--rounds N] [--examples N] [--model cnn|mlp]" \
    "[--shards \"1 2\"] [--workers \"1 2\"] [--overlap]" >&2
  exit 2
fi
out=$(mkdir -p "$1" && cd "$1" && pwd)
shift
rounds=3
examples=20000
model=cnn
shards="2"
workers="1 2"
overlap=0
baseline=""
epochs=1
bin=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --examples) examples="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --shards) shards="$2"; shift 2 ;;
    --workers) workers="$2"; shift 2 ;;
    --overlap) overlap=1; shift ;;
    --baseline) baseline=$(cd "$2" && pwd); shift 2 ;;
    --bin) bin=(--bin "$(cd "$2" && pwd)"); shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    *) echo "torch_throughput.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/../.."
launch=deploy/local_pytorch.sh
data="--model=$model --train_examples=$examples --test_examples=1000 --log_every=0"

rate() {  # the examples/s figure of a run's log
  grep -hE '(local done|examples/s in total)' "$1" |
    sed -E 's/.*[( ]([0-9.]+) examples\/s.*/\1/' | tail -n 1
}

accuracy() {  # the final test accuracy of a run's log
  grep -h 'final test accuracy' "$1" | sed -E 's/.*: //' | tail -n 1
}

run() {  # NAME ROUND ARGS...
  local name=$1 round=$2
  shift 2
  "$launch" --no-build --epochs "$epochs" "$@" >"$out/$name.$round.log" 2>&1 ||
    { echo "torch_throughput.sh: $name failed; see $out/$name.$round.log" >&2; exit 1; }
  echo "$name $(rate "$out/$name.$round.log") $(accuracy "$out/$name.$round.log")"
}

setups() {  # ROUND PREFIX [--bin DIR]: every asyncps setup with one build
  local r=$1 prefix=$2
  shift 2
  for s in $shards; do
    for w in $workers; do
      name="${prefix}asyncps_${s}shards_${w}workers"
      run "$name" "$r" "$@" --shards "$s" --workers "$w" \
        --worker-flags "$data" --logdir "$out/$name.$r"
      if [ "$overlap" = 1 ]; then
        run "${name}_overlap_push" "$r" "$@" --shards "$s" --workers "$w" \
          --worker-flags "$data --overlap_push" \
          --logdir "$out/${name}_overlap_push.$r"
        run "${name}_overlap" "$r" "$@" --shards "$s" --workers "$w" \
          --worker-flags "$data --overlap_pull --overlap_push" \
          --logdir "$out/${name}_overlap.$r"
      fi
    done
  done
}

for ((r = 0; r < rounds; r++)); do
  OMP_NUM_THREADS=1 run local_1thread "$r" --local --worker-flags "$data --threads=1"
  OMP_NUM_THREADS=2 run local_2threads "$r" --local --worker-flags "$data --threads=2"
  if [ -n "$baseline" ] && ((r % 2 == 1)); then
    setups "$r" base_ --bin "$baseline"
  fi
  setups "$r" "" "${bin[@]}"
  if [ -n "$baseline" ] && ((r % 2 == 0)); then
    setups "$r" base_ --bin "$baseline"
  fi
done | tee "$out/runs.txt"
/usr/bin/python3 - "$out/runs.txt" <<'PY'
import statistics, sys
runs, accs = {}, {}
for line in open(sys.argv[1]):
    name, rate, acc = line.split()
    runs.setdefault(name, []).append(float(rate))
    accs.setdefault(name, []).append(float(acc))
base = statistics.median(runs["local_1thread"])
for name, rates in runs.items():
    med = statistics.median(rates)
    print(f"{name:38s} examples/s {med:8.0f} (median of {len(rates)})  "
          f"ratio to local_1thread {med / base:.2f}  test accuracy "
          f"{statistics.median(accs[name]):.4f}")
PY
