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
bin=$(bazel info bazel-bin 2>/dev/null)
server_bin="$bin/server/ps_server"
[ -x "$server_bin" ] && [ -f "$bin/python/site/asyncps/_native.so" ] ||
  { echo "local_pytorch.sh: build outputs missing; run without --no-build" >&2; exit 1; }
export PYTHONPATH="$bin/python/site${PYTHONPATH:+:$PYTHONPATH}"
example=python/examples/fashion_mnist_cnn.py
epoch_flag=${epochs:+--epochs=$epochs}

if [ "$local_only" = 1 ]; then
  # shellcheck disable=SC2086
  exec "$python" "$example" --local $epoch_flag $worker_flags
fi

[ -n "$logdir" ] || logdir=$(mktemp -d -t asyncps-pytorch.XXXXXX)
mkdir -p "$logdir"
declare -A name_of=()
pids=()

cleanup() {
  trap - EXIT INT TERM
  local alive=()
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
  if [ ${#alive[@]} -gt 0 ]; then
    kill -TERM "${alive[@]}" 2>/dev/null || true
    for _ in $(seq 50); do
      local any=0
      for p in "${alive[@]}"; do kill -0 "$p" 2>/dev/null && any=1; done
      [ "$any" = 0 ] && break
      sleep 0.1
    done
    kill -KILL "${alive[@]}" 2>/dev/null || true
  fi
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'echo; echo "interrupted; stopping the cluster"; cleanup; exit 130' INT TERM

fail() {  # name, pid, code
  echo "local_pytorch.sh: $1 (pid $2) exited with code $3; last lines of $logdir/$1.log:" >&2
  tail -n 15 "$logdir/$1.log" >&2 || true
  exit 1
}

start=$(date +%s.%N)
servers=""
for ((i = 0; i < shards; i++)); do
  rm -f "$logdir/shard$i.port"
  # shellcheck disable=SC2086
  "$server_bin" --shard_index=$i --num_shards=$shards --host=127.0.0.1 --port=0 \
    --port_file="$logdir/shard$i.port" $server_flags >"$logdir/shard$i.log" 2>&1 &
  pids+=($!); name_of[$!]="shard$i"
done
for ((i = 0; i < shards; i++)); do
  for _ in $(seq 300); do
    [ -s "$logdir/shard$i.port" ] && break
    pid=${pids[$i]}
    if ! kill -0 "$pid" 2>/dev/null; then wait "$pid" && rc=0 || rc=$?; fail "shard$i" "$pid" "$rc"; fi
    sleep 0.1
  done
  [ -s "$logdir/shard$i.port" ] || { echo "local_pytorch.sh: shard$i did not start within 30 s" >&2; exit 1; }
  servers="${servers:+$servers,}127.0.0.1:$(cat "$logdir/shard$i.port")"
done
echo "cluster: $shards shard(s) at $servers; $workers PyTorch worker(s); logs in $logdir"

worker_pids=()
for ((w = 0; w < workers; w++)); do
  # One torch thread per worker: the workers already share the cores.
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=1 "$python" -u "$example" --servers="$servers" --worker_id=$w \
    --num_workers=$workers --threads=1 $epoch_flag $worker_flags \
    > >(tee "$logdir/worker$w.out" | grep --line-buffered -E "^(worker $w|final)") \
    2>"$logdir/worker$w.log" &
  pids+=($!); name_of[$!]="worker$w"; worker_pids+=($!)
done

# Wait for the workers; stop at the first process that fails.
remaining=${#worker_pids[@]}
while [ "$remaining" -gt 0 ]; do
  set +e
  wait -n -p done_pid "${pids[@]}"
  rc=$?
  set -e
  name=${name_of[$done_pid]:-unknown}
  if [ "$rc" != 0 ]; then
    [ -f "$logdir/$name.out" ] && cat "$logdir/$name.out" >>"$logdir/$name.log"
    fail "$name" "$done_pid" "$rc"
  fi
  case "$name" in
    shard*) fail "$name" "$done_pid" "$rc (a shard stopped during training)" ;;
    worker*) remaining=$((remaining - 1)) ;;
  esac
  for i in "${!pids[@]}"; do [ "${pids[$i]}" = "$done_pid" ] && unset 'pids[i]'; done
  pids=("${pids[@]}")
done
end=$(date +%s.%N)
acc=$(grep -h '^final test accuracy:' "$logdir"/worker0.out | tail -n 1 | awk '{print $4}')
rate=$(grep -h ' done: ' "$logdir"/worker*.out | sed -E 's/.*\(([0-9.]+) examples\/s\).*/\1/' | paste -sd+ | bc)
printf 'cluster of %d shard(s) and %d PyTorch worker(s): %.1f s wall, %s examples/s in total\n' \
  "$shards" "$workers" "$(echo "$end - $start" | bc)" "${rate:-?}"
echo "final test accuracy: ${acc:-unknown}"
[ -n "$acc" ]
