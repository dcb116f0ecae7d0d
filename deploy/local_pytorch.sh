#!/usr/bin/env bash
# Runs asynchronous PyTorch training on a local asyncps cluster: S ps_server
# shards and W PyTorch worker processes (python/examples/fashion_mnist_cnn.py,
# a small CNN on Fashion-MNIST), then prints the final test accuracy.
# Installs missing Debian packages (python3-torch, python3-numpy, ...) and
# builds first. Leaves no process behind: on Ctrl-C, on any process failing
# (named, with its last log lines, exit 1), and at the end.
#
#   deploy/local_pytorch.sh                       # 2 shards, 2 workers
#   deploy/local_pytorch.sh --workers 4 --epochs 3
#   deploy/local_pytorch.sh --server-flags "--consistency=ssp --ssp_slack=2" \
#                           --worker-flags "--optimizer=adam --lr=0.001"
#   deploy/local_pytorch.sh --local               # single-process baseline
set -euo pipefail
cd "$(dirname "$0")/.."

shards=2
workers=2
epochs=""
server_flags=""
worker_flags=""
logdir=""
build=1
local_only=0
bin=""
python=/usr/bin/python3

usage() {
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
  cat <<USAGE
options:
  --shards N           server shards (default $shards)
  --workers N          PyTorch worker processes (default $workers)
  --epochs N           epochs per worker over its share (default: the
                       example's, 10)
  --server-flags "..." extra ps_server flags (see ps_server --help)
  --worker-flags "..." extra flags of the example (see
                       python/examples/fashion_mnist_cnn.py --help)
  --local              no cluster: train in one process with torch.optim
  --logdir DIR         keep logs here (default: a fresh temporary folder)
  --no-build           use what is already built
  --bin DIR            use the build in DIR (a bazel-bin folder, or a copy
                       holding server/ps_server and python/site) instead of
                       the workspace's; implies --no-build
USAGE
}

while [ $# -gt 0 ]; do
  case "$1" in
    --shards) shards="$2"; shift 2 ;;
    --workers) workers="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --server-flags) server_flags="$2"; shift 2 ;;
    --worker-flags) worker_flags="$2"; shift 2 ;;
    --logdir) logdir="$2"; shift 2 ;;
    --local) local_only=1; shift ;;
    --no-build) build=0; shift ;;
    --bin) bin="$2"; build=0; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "local_pytorch.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for v in shards workers ${epochs:+epochs}; do
  if ! [[ "${!v}" =~ ^[1-9][0-9]*$ ]]; then
    echo "local_pytorch.sh: --$v must be a positive integer, got '${!v}'" >&2; exit 2
  fi
done

if [ "$build" = 1 ]; then
  deploy/install_deps.sh
  echo "building ps_server and the asyncps Python package ..."
  bazel build //server:ps_server //python:asyncps 2>&1 |
    grep -E 'ERROR|error:' && exit 1
fi
[ -n "$bin" ] || bin=$(bazel info bazel-bin 2>/dev/null)
server_bin="$bin/server/ps_server"
if [ ! -x "$server_bin" ] || [ ! -f "$bin/python/site/asyncps/_native.so" ]; then
  echo "local_pytorch.sh: build outputs missing; run without --no-build" >&2; exit 1
fi
export PYTHONPATH="$bin/python/site${PYTHONPATH:+:$PYTHONPATH}"
example=python/examples/fashion_mnist_cnn.py
epoch_flag=${epochs:+--epochs=$epochs}

if [ "$local_only" = 1 ]; then
  # shellcheck disable=SC2086
  exec "$python" "$example" --local $epoch_flag $worker_flags
fi

# shellcheck source=deploy/cluster_lib.sh
. deploy/cluster_lib.sh
cluster_init local_pytorch.sh "$logdir"
cluster_start_shards "$server_bin" "$shards" "$server_flags"
echo "cluster: $shards shard(s) at $servers; $workers PyTorch worker(s); logs in $logdir"

for ((w = 0; w < workers; w++)); do
  # One torch thread per worker: the workers already share the cores.
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=1 "$python" -u "$example" --servers="$servers" --worker_id=$w \
    --num_workers=$workers --threads=1 $epoch_flag $worker_flags \
    > >(tee "$logdir/worker$w.out" | grep --line-buffered -E "^(worker $w|final)") \
    2>"$logdir/worker$w.log" &
  cluster_track "worker$w" $! worker
done
cluster_wait_workers
cluster_report "$shards" "$workers PyTorch worker(s)"
