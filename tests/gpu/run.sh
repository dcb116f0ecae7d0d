#!/usr/bin/env bash
# GPU checks for a machine with an NVIDIA H100/H200 (sm_90), in one go:
#   1. build the CUDA backend, its parity test and the benchmark
#      (bazel --config=cuda),
#   2. run //tests/kernels:cuda_parity_test (CUDA vs CPU, op by op and one
#      MLP step); on a machine where nvidia-smi lists a GPU a missing CUDA
#      device fails the test instead of skipping it,
#   3. run //tests/bench:backend_bench (examples/s, CUDA vs CPU),
#   4. a short distributed run: 2 shards + 1 GPU worker (deploy/local.sh).
# Results go to OUTDIR: summary.txt (one line per step), nvidia-smi.txt,
# build.txt, parity.txt, bench.txt, bench.csv.
#
# Usage: tests/gpu/run.sh OUTDIR
# Every step has its own timeout; all together stay under 5 minutes. A failed
# step is recorded and the next ones still run; the exit status is non-zero
# if any step failed. Needs Bazel and the Debian libraries of TOOLCHAIN.md and
# the CUDA toolkit at /usr/local/cuda; no network.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
mkdir -p "$1"
OUT="$(cd "$1" && pwd)"
cd "$(dirname "$0")/../.."

SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
FAILED=0
START=$(date +%s)

# step NAME TIMEOUT_S LOG CMD...: runs CMD with a timeout, output to the
# terminal and LOG; records "NAME: ok|FAILED (rc=..)" in the summary.
step() {
  local name="$1" limit="$2" log="$3"
  shift 3
  echo "=== $name (timeout ${limit}s)" | tee -a "$log"
  local rc=0
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$log" || rc=$?
  if [[ $rc -eq 0 ]]; then
    echo "$name: ok ($(($(date +%s) - START))s elapsed)" | tee -a "$SUMMARY"
  else
    [[ $rc -eq 124 ]] && echo "$name: timed out after ${limit}s" | tee -a "$log"
    echo "$name: FAILED (rc=$rc)" | tee -a "$SUMMARY"
    FAILED=1
  fi
  return 0
}

if ! command -v bazel >/dev/null; then
  echo "bazel: not found on PATH; see TOOLCHAIN.md" | tee -a "$SUMMARY"
  exit 1
fi

# --- 0. The GPU --------------------------------------------------------------
REQUIRE_CUDA=0
if timeout 15 nvidia-smi -L >"$OUT/nvidia-smi.txt" 2>&1 &&
    grep -q '^GPU ' "$OUT/nvidia-smi.txt"; then
  REQUIRE_CUDA=1
  timeout 15 nvidia-smi >>"$OUT/nvidia-smi.txt" 2>&1 || true
fi
echo "gpu present: $REQUIRE_CUDA ($(head -n1 "$OUT/nvidia-smi.txt"))" |
  tee -a "$SUMMARY"

JOBS="--jobs=$(nproc)"
CUDA_FLAGS=(--config=cuda "$JOBS")

# --- 1. Build ----------------------------------------------------------------
step build 120 "$OUT/build.txt" \
  bazel build "${CUDA_FLAGS[@]}" //kernels:backend \
  //tests/kernels:cuda_parity_test //tests/bench:backend_bench \
  //server:ps_server //worker:ps_worker

# --- 2. Parity tests ---------------------------------------------------------
step parity 55 "$OUT/parity.txt" \
  bazel test "${CUDA_FLAGS[@]}" --test_output=all \
  --test_env=ASYNCPS_REQUIRE_CUDA="$REQUIRE_CUDA" \
  --test_env=LD_LIBRARY_PATH --test_env=CUDA_VISIBLE_DEVICES \
  //tests/kernels:cuda_parity_test

# --- 3. Benchmark ------------------------------------------------------------
# 2 models x 2 backends x <= 8 s timed each, plus warmup and CUDA start-up.
step bench 55 "$OUT/bench.txt" \
  bazel-bin/tests/bench/backend_bench --iters=50 --warmup=3 \
  --max_seconds=8 --csv="$OUT/bench.csv"

# --- 4. Distributed: 2 shards + 1 GPU worker -------------------------------
# Two ps_server shards on loopback and one ps_worker on the CUDA backend for
# 2 epochs; the worker prints its progress and the final test accuracy.
step distributed 60 "$OUT/distributed.txt" \
  deploy/local.sh --cuda --no-build --shards 2 --workers 1 --epochs 2 \
  --logdir "$OUT/distributed" --worker-flags "--device=cuda --log_every_steps=200"
grep -h '^final test accuracy' "$OUT/distributed.txt" | tail -n 1 |
  sed 's/^/distributed: /' | tee -a "$SUMMARY" || true

echo "total: $(($(date +%s) - START))s" | tee -a "$SUMMARY"
exit "$FAILED"
