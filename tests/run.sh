#!/usr/bin/env bash
# Builds asyncps and runs the whole test suite.
#
#   tests/run.sh            # installs missing Debian packages, builds, tests
#
# Ends with one line "N passed, N failed" (Bazel test targets) and exits
# non-zero when any test failed or the build broke. When nvcc is present the
# CUDA backend is compiled too (compile only: tests never need a GPU).
set -uo pipefail
cd "$(dirname "$0")/.."

"$(dirname "$0")/../deploy/install_deps.sh" || { echo "0 passed, 1 failed"; exit 1; }

log=$(mktemp)
trap 'rm -f "$log"' EXIT

t0=$(date +%s)
echo "== build"
if ! bazel build //... >"$log" 2>&1; then
  grep -E 'ERROR|error:' "$log" | head -n 40
  echo "0 passed, 1 failed"
  exit 1
fi
echo "build: $(($(date +%s) - t0)) s"

cuda_failed=0
if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null 2>&1; then
  echo "== build --config=cuda (compile only)"
  if ! bazel build --config=cuda //kernels:backend //tests/kernels:cuda_parity_test \
      >"$log" 2>&1; then
    grep -E 'ERROR|error' "$log" | head -n 40
    cuda_failed=1
  fi
  echo "cuda build: $(($(date +%s) - t0)) s since start"
fi

t1=$(date +%s)
echo "== test"
bazel test //... 2>&1 | tee "$log"
test_rc=${PIPESTATUS[0]}
echo "tests: $(($(date +%s) - t1)) s"

passed=$(grep -cE '^//\S+\s+(\(cached\) )?PASSED' "$log")
failed=$(grep -cE '^//\S+\s+(\(cached\) )?(FAILED|TIMEOUT|NO STATUS|FLAKY|INCOMPLETE)' "$log")
failed=$((failed + cuda_failed))
if [ "$test_rc" != 0 ] && [ "$failed" = 0 ]; then failed=1; fi
if [ "${CI:-}" = "true" ]; then bazel shutdown >/dev/null 2>&1 || true; fi
echo "${passed} passed, ${failed} failed"
[ "$failed" = 0 ]
