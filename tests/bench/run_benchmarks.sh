#!/usr/bin/env bash
# Builds the benchmarks with -c opt and runs them with bounded time, writing
# each one's output to OUTDIR:
#   apply_bench.txt       server apply path vs memcpy and bare optimizer loops
#   push_pull_bench.txt   PsClient push/pull vs TCP and gRPC ceilings on a
#                         64 MiB model, 1 and 2 shards, 1 and 2 clients
#   backend_bench.txt     Mlp examples/s and GEMM TFLOP/s (CPU; CUDA if any)
#   sparse_bench.txt      sparse rows/s pulled and pushed vs the dense path
#   scale_bench.txt       latency, shard memory and threads as simulated
#                         workers grow 4 -> 256 (ASP, SSP), same total load
#   step_bench.txt        a CTR-shaped step's pull and push latency, one call
#                         (tensors and rows together) against two
# Server logs of push_pull_bench go to OUTDIR/tmp. The six runs are capped
# at 100 + 300 + 45 + 150 + 300 + 60 s; a run that hits its cap is reported and the script
# goes on. Exits non-zero if the build or any run fails.
#
# Usage: tests/bench/run_benchmarks.sh OUTDIR [--skip_build]
set -u

if [[ $# -lt 1 || "$1" == -* ]]; then
  echo "usage: $0 OUTDIR [--skip_build]" >&2
  exit 2
fi
out=$1
skip_build=0
[[ "${2:-}" == "--skip_build" ]] && skip_build=1
mkdir -p "$out/tmp" || exit 2
out=$(cd "$out" && pwd)

cd "$(dirname "$0")/../.." || exit 2
targets=(//tests/bench:apply_bench //tests/bench:push_pull_bench
         //tests/bench:backend_bench //tests/bench:sparse_bench
         //tests/bench:scale_bench //tests/bench:step_bench)
if [[ $skip_build -eq 0 ]]; then
  bazel build -c opt "${targets[@]}" || { echo "build failed" >&2; exit 1; }
fi
bin=$(bazel info -c opt bazel-bin 2>/dev/null) || exit 1

failed=0
run() {  # run NAME SECONDS ARGS...
  local name=$1 limit=$2
  shift 2
  echo "== $name (at most ${limit} s)"
  local start=$SECONDS
  TEST_TMPDIR="$out/tmp" timeout --kill-after=10 "$limit" "$@" \
      >"$out/$name.txt" 2>"$out/$name.err"
  local rc=$?
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    echo "   $name: stopped after ${limit} s (partial output kept)"
    failed=1
  elif [[ $rc -ne 0 ]]; then
    echo "   $name: exit $rc; see $out/$name.err"
    failed=1
  fi
  echo "   $((SECONDS - start)) s, $(wc -l <"$out/$name.txt") lines in $out/$name.txt"
}

run apply_bench 100 "$bin/tests/bench/apply_bench" --min_seconds=0.3
run push_pull_bench 300 "$bin/tests/bench/push_pull_bench" \
    --ps_server="$bin/server/ps_server" --reps=2 --seconds=1
run backend_bench 45 "$bin/tests/bench/backend_bench" --iters=20 \
    --max_seconds=3
run sparse_bench 150 "$bin/tests/bench/sparse_bench"
run scale_bench 300 "$bin/tests/bench/scale_bench"
run step_bench 60 "$bin/tests/bench/step_bench"
exit $failed
